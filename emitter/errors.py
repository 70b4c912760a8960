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
