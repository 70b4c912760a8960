"""One error root. The CLI prints any EmitterError as a clean message (no traceback) with its exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


class EmitterError(Exception):
    """Root of every error a user can cause. `exit_code` is what the CLI exits with."""

    exit_code = 1

    def render(self) -> str:
        return str(self)


@dataclass
class SpecError(EmitterError):
    """A spec (or profile config) is malformed: names the file, line, key path, value, allowed values and a fix."""

    message: str
    file: str | None = None
    line: int | None = None
    key_path: str | None = None
    value: Any = None
    allowed: Sequence[Any] | str | None = None
    fix: str | None = None
    exit_code: int = field(default=2, init=False)

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        where = self.file or "<spec>"
        if self.line is not None:
            where += f":{self.line}"
        parts = [f"{where}: error: {self.message}"]
        if self.key_path:
            parts.append(f"  key:     {self.key_path}")
        if self.value is not None:
            parts.append(f"  value:   {self.value!r}")
        if self.allowed is not None:
            allowed = self.allowed if isinstance(self.allowed, str) else ", ".join(map(str, self.allowed))
            parts.append(f"  allowed: {allowed}")
        if self.fix:
            parts.append(f"  fix:     {self.fix}")
        return "\n".join(parts)


class ManifestError(EmitterError):
    """A manifest or build record is missing, unreadable or of an unknown schema version."""

    exit_code = 2


class CutlassNotFound(EmitterError):
    exit_code = 2


def report_internal_error(exc: BaseException) -> str:
    """Write the full traceback of an unexpected exception to a log file; return the one line to print.

    The log goes to $EMITTER_LOG_DIR, else $XDG_STATE_HOME/emitter, else ~/.local/state/emitter, else the
    temporary directory (whichever can be written)."""
    import os
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    candidates = [os.environ.get("EMITTER_LOG_DIR"),
                  os.path.join(os.environ["XDG_STATE_HOME"], "emitter") if os.environ.get("XDG_STATE_HOME") else None,
                  os.path.join(os.path.expanduser("~"), ".local", "state", "emitter"),
                  tempfile.gettempdir()]
    where = "(no writable log directory)"
    for d in candidates:
        if not d:
            continue
        try:
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"emitter-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
            with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(text)
            where = path
            break
        except OSError:
            continue
    msg = str(exc).splitlines()[0] if str(exc) else ""
    if len(msg) > 300:
        msg = msg[:300] + "..."
    msg = msg.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"emitter: internal error (a bug): {type(exc).__name__}: {msg}; full traceback in {where}"
