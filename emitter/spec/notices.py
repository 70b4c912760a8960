"""Warnings about specs: input that is valid but almost certainly not what its author meant (an exclude entry
that can match nothing, an alias given beside the key it stands for). The emit goes on; the warning names the
file, line, key path and value like a SpecError does, with "warning:" in place of "error:".

A parser calls `warn(src, path, message, value=..., fix=...)` (`src` as for every spec parser: a loader
Document or a family's context object with `error(...)`). Inside `with collecting() as found:` the warnings
are gathered, once each, for the caller to report (emit prints them on stderr and keeps them on its result);
outside it they are written to stderr at once, so no caller can lose them.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from emitter.spec.loader import KeyPath
from emitter.spec.numbers import shown


@dataclass(frozen=True)
class SpecWarning:
    message: str
    file: str | None = None
    line: int | None = None
    key_path: str | None = None
    value: Any = None
    fix: str | None = None

    def render(self) -> str:
        where = (self.file or "<spec>") + (f":{self.line}" if self.line is not None else "")
        parts = [f"{where}: warning: {self.message}"]
        if self.key_path:
            parts.append(f"  key:     {self.key_path}")
        if self.value is not None:
            parts.append(f"  value:   {self.value!r}")
        if self.fix:
            parts.append(f"  fix:     {self.fix}")
        return "\n".join(parts)


_found: contextvars.ContextVar[list[SpecWarning] | None] = contextvars.ContextVar("emitter_spec_warnings",
                                                                                  default=None)


@contextlib.contextmanager
def collecting() -> Iterator[list[SpecWarning]]:
    """Gather the warnings raised inside the block (each distinct warning once) into the list it yields."""
    found: list[SpecWarning] = []
    token = _found.set(found)
    try:
        yield found
    finally:
        _found.reset(token)


def warn(src: Any, path: KeyPath, message: str, *, value: Any = None, fix: str | None = None) -> SpecWarning:
    err = src.error(path, message, value=value, fix=fix)     # file, line and key path as an error would name them
    w = SpecWarning(message, err.file, err.line, err.key_path, shown(value), fix)
    found = _found.get()
    if found is None:
        sys.stderr.write(w.render() + "\n")
    elif w not in found:
        found.append(w)
    return w

