"""The manifest: the contract between `emit` and every later command (which never reads the YAML)."""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emitter.errors import ManifestError
from emitter.fsutil import atomic_write_text, safe_relpath

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"

INSTANCE_KEYS = {"name", "family", "arch", "source", "spec", "spec_hash", "config"}
REJECTED_KEYS = {"family", "arch", "spec", "spec_hash", "config", "rule", "reason"}
MAX_MANIFEST_BYTES = 256 << 20
# An instance name becomes a file name (lib<name>.so), a directory and a C symbol: a C identifier that
# fits a file name. Manifests come from other tools too, so nothing in one is trusted.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_STR_KEYS = ("name", "family", "arch", "source", "spec", "spec_hash")


def manifest_path(out: str | Path) -> Path:
    p = Path(out)
    return p if p.name == MANIFEST_NAME else p / MANIFEST_NAME


def dumps(data: dict[str, Any]) -> str:
    """Manifest text: top-level keys indented, one list entry per line.

    Readable and diffable, and fast: each entry goes through json's C encoder (indent=2 over a
    10,000-instance manifest takes seconds in the pure-Python encoder)."""
    lines = ["{"]
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value:
            lines.append(f"  {json.dumps(key)}: [")
            lines.extend(f"    {json.dumps(v)}{',' if j < len(value) - 1 else ''}" for j, v in enumerate(value))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write(out: str | Path, data: dict[str, Any]) -> Path:
    path = manifest_path(out)
    atomic_write_text(path, dumps(data), durable=True)
    return path


def validate(data: Any, where: str = MANIFEST_NAME) -> dict[str, Any]:
    """Check the manifest's shape; raise ManifestError naming what is wrong."""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: not a manifest (expected a JSON object)")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(f"{where}: schema_version {version!r} is not supported (this emitter reads "
                            f"{SCHEMA_VERSION}); re-run `emitter emit` with this version")
    for key in ("instances", "rejected"):
        if not isinstance(data.get(key), list):
            raise ManifestError(f"{where}: '{key}' must be a list, not {_kind(data.get(key))}")
    fix = "re-run `emitter emit` to write a fresh manifest"
    names = set()
    for i, inst in enumerate(data["instances"]):
        if not isinstance(inst, dict):
            raise ManifestError(f"{where}: instances[{i}] must be an object, not {_kind(inst)} ({fix})")
        missing = INSTANCE_KEYS - set(inst)
        if missing:
            raise ManifestError(f"{where}: instances[{i}] lacks {sorted(missing)}")
        for key in _STR_KEYS:
            if not isinstance(inst[key], str):
                raise ManifestError(f"{where}: instances[{i}].{key} must be a string, not {_kind(inst[key])} "
                                    f"({_short(inst[key])}); {fix}")
        if not isinstance(inst["config"], dict):
            raise ManifestError(f"{where}: instances[{i}].config must be an object, not {_kind(inst['config'])}")
        name = inst["name"]
        if not NAME_RE.fullmatch(name):
            raise ManifestError(f"{where}: instances[{i}].name {_short(name)} is not a C identifier of at most 200 "
                                f"characters ([A-Za-z_][A-Za-z0-9_]*); it names files and symbols, so it is refused")
        why = safe_relpath(inst["source"])
        if why is not None:
            raise ManifestError(f"{where}: instances[{i}].source {_short(inst['source'])} is refused: {why}; sources "
                                f"are relative paths inside the manifest's directory")
        if name in names:
            raise ManifestError(f"{where}: duplicate instance name {name}")
        names.add(name)
    for i, rej in enumerate(data["rejected"]):
        if not isinstance(rej, dict):
            raise ManifestError(f"{where}: rejected[{i}] must be an object, not {_kind(rej)} ({fix})")
        missing = REJECTED_KEYS - set(rej)
        if missing:
            raise ManifestError(f"{where}: rejected[{i}] lacks {sorted(missing)}")
        if not isinstance(rej["config"], dict):
            raise ManifestError(f"{where}: rejected[{i}].config must be an object, not {_kind(rej['config'])}")
    return data


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _read(path: Path) -> bytes:
    """A manifest's bytes: a regular file of at most MAX_MANIFEST_BYTES (a FIFO or /dev/zero must not hang us)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ManifestError(f"{path}: cannot read the manifest ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ManifestError(f"{path}: is a directory, not a manifest; remove it and re-run `emitter emit`")
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(f"{path}: not a regular file (a FIFO or device?); refused")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: {st.st_size:,} bytes is larger than a manifest can be "
                            f"({MAX_MANIFEST_BYTES:,}); refused")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{path}: cannot read the manifest ({e.strerror or e})") from None


def load(out: str | Path) -> dict[str, Any]:
    path = manifest_path(out)
    try:
        data = json.loads(_read(path).decode("utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest here; run `emitter emit <spec> -o {path.parent}` first") from None
    except NotADirectoryError:
        raise ManifestError(f"{path}: no manifest here ({path.parent} is not a directory)") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ManifestError(f"{path}: nested too deeply to be a manifest") from None
    return validate(data, str(path))


@dataclass(frozen=True)
class ManifestInstance:
    """Convenience view of one manifest instance entry."""

    root: Path
    entry: dict[str, Any]

    @property
    def name(self) -> str:
        return self.entry["name"]

    @property
    def source(self) -> Path:
        return self.root / self.entry["source"]

    @property
    def config(self) -> dict[str, Any]:
        return self.entry["config"]


def instances(out: str | Path) -> list[ManifestInstance]:
    path = manifest_path(out)
    data = load(path)
    return [ManifestInstance(path.parent, e) for e in data["instances"]]
