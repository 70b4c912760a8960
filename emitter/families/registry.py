"""The one registry of kernel families: stages look a family up here by the name a spec entry or a
manifest entry carries, and hold no family-specific code. Adding a family is one line below plus its
folders (emitter/families/<name>/, templates/<name>/)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Mapping, Sequence

from emitter.errors import EmitterError
from emitter.families.base import RUNTIME_DATA, VERIFY_HOOKS, FamilyNotRunnable

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


def runtime_family(name: str, need: Sequence[str] = VERIFY_HOOKS) -> ModuleType:
    """`emitter.families.<name>.runtime`, checked to provide `need` (and the data attributes).

    Raises UnknownFamily (registry) for a name not registered, FamilyNotRunnable naming the missing hooks."""
    family_module(name)        # UnknownFamily for names not registered
    try:
        mod = importlib.import_module(FAMILIES[name] + ".runtime")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(FAMILIES[name]):
            raise FamilyNotRunnable(f"family {name!r} has no run-time hooks yet ({FAMILIES[name]}.runtime)") from None
        raise
    missing = [h for h in (*RUNTIME_DATA, *need) if not hasattr(mod, h)]
    if missing:
        raise FamilyNotRunnable(f"family {name!r} ({mod.__name__}) lacks run-time hooks: {', '.join(missing)}")
    return mod


def entry_family(entry: Mapping[str, Any]) -> str:
    """The family a manifest entry names (entries written before families existed are GEMM)."""
    fam = entry.get("family", DEFAULT_FAMILY) if isinstance(entry, Mapping) else DEFAULT_FAMILY
    return fam if isinstance(fam, str) else repr(fam)
