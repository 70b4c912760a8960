"""The one registry of kernel families: stages look a family up here by the name a spec entry or a
manifest entry carries, and hold no family-specific code. Adding a family is one line below plus its
folders (emitter/families/<name>/, templates/<name>/)."""

from __future__ import annotations

import importlib
from types import ModuleType

from emitter.errors import EmitterError

FAMILIES: dict[str, str] = {
    "gemm": "emitter.families.gemm",
    "attention": "emitter.families.attention",
    "conv": "emitter.families.conv",
}
DEFAULT_FAMILY = "gemm"


class UnknownFamily(EmitterError):
    exit_code = 2


def family_module(name: str) -> ModuleType:
    """The package of family `name` (raises UnknownFamily naming the families there are)."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise UnknownFamily(f"unknown kernel family {name!r}: known families are {', '.join(sorted(FAMILIES))}")
    return importlib.import_module(FAMILIES[name])


def available() -> list[str]:
    """Families whose package imports here (a family in progress may not be there yet)."""
    out = []
    for name in FAMILIES:
        try:
            family_module(name)
        except ImportError:
            continue
        out.append(name)
    return out
