"""Atomic file writes: a crash never leaves a half-written file where a reader would take it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = False) -> None:
    """Write to a temporary file beside `path`, then rename it over `path` (atomic on POSIX).

    A reader sees the old file or the new one, never a part. `durable` also fsyncs before the
    rename (survives power loss; costs milliseconds per file, so only for the manifest)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary name of our own (not mkstemp: its O_EXCL create cost ~1 ms a file on our disks,
    # a third of a 10,000-instance emit). pid + thread id keep concurrent writers apart.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str, *, durable: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, durable: bool = True) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", durable=durable)


def write_if_changed(path: str | os.PathLike[str], text: str) -> bool:
    """Atomically write `text` unless the file already holds exactly it; returns True if written."""
    path = Path(path)
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, data)
    return True
