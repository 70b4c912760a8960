"""The one registry of kernel families: stages look a family up here by the name a spec entry or a
manifest entry carries, and hold no family-specific code. Adding a family is one line below plus its
folders (emitter/families/<name>/, templates/<name>/)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Mapping, Sequence

from emitter.errors import EmitterError
from emitter.families.base import (EMIT_HOOKS, RUNTIME_DATA, VERIFY_HOOKS, Family, FamilyContractError,
                                   FamilyNotRunnable, RuntimeFamily, contract_misfits)

FAMILIES: dict[str, str] = {
    "gemm": "emitter.families.gemm",
    "attention": "emitter.families.attention",
    "conv": "emitter.families.conv",
}
DEFAULT_FAMILY = "gemm"


class UnknownFamily(EmitterError):
    exit_code = 2


_FITS: set[tuple[str, str]] = set()          # (module, hooks) checked against their protocol already


def family_module(name: str, need: Sequence[str] = EMIT_HOOKS) -> ModuleType:
    """The package of family `name`, checked against the Family protocol for the hooks `need` (the emit hooks;
    () where a stage only wants an optional hook). Raises UnknownFamily naming the families there are, and
    FamilyContractError naming what does not fit."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise UnknownFamily(f"unknown kernel family {name!r}: known families are {', '.join(sorted(FAMILIES))}")
    mod = importlib.import_module(FAMILIES[name])
    if need and (mod.__name__, ",".join(need)) not in _FITS:
        misfits = contract_misfits(mod, Family, need)
        if misfits:
            raise FamilyContractError(f"family {name!r} ({mod.__name__}) does not fit the Family protocol "
                                      f"(emitter.families.base): {'; '.join(misfits)}")
        _FITS.add((mod.__name__, ",".join(need)))
    return mod


def available() -> list[str]:
    """Families whose package imports here (a family in progress may not be there yet)."""
    out = []
    for name in FAMILIES:
        try:
            family_module(name, need=())
        except ImportError:
            continue
        out.append(name)
    return out


def runtime_family(name: str, need: Sequence[str] = VERIFY_HOOKS) -> ModuleType:
    """`emitter.families.<name>.runtime`, checked to provide `need` (and the data attributes).

    Raises UnknownFamily (registry) for a name not registered, FamilyNotRunnable naming the missing hooks."""
    family_module(name, need=())        # UnknownFamily for names not registered
    try:
        mod = importlib.import_module(FAMILIES[name] + ".runtime")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(FAMILIES[name]):
            raise FamilyNotRunnable(f"family {name!r} has no run-time hooks yet ({FAMILIES[name]}.runtime)") from None
        raise
    missing = [h for h in (*RUNTIME_DATA, *need) if not hasattr(mod, h)]
    if missing:
        raise FamilyNotRunnable(f"family {name!r} ({mod.__name__}) lacks run-time hooks: {', '.join(missing)}")
    key = (mod.__name__, ",".join((*RUNTIME_DATA, *need)))
    if key not in _FITS:
        misfits = contract_misfits(mod, RuntimeFamily, [h for h in (*RUNTIME_DATA, *need) if hasattr(RuntimeFamily, h)
                                                        or h in RuntimeFamily.__annotations__])
        if misfits:
            raise FamilyNotRunnable(f"family {name!r} ({mod.__name__}) has run-time hooks that do not fit the "
                                    f"RuntimeFamily protocol (emitter.families.base): {'; '.join(misfits)}")
        _FITS.add(key)
    return mod


def entry_family(entry: Mapping[str, Any]) -> str:
    """The family a manifest entry names (entries written before families existed are GEMM)."""
    fam = entry.get("family", DEFAULT_FAMILY) if isinstance(entry, Mapping) else DEFAULT_FAMILY
    return fam if isinstance(fam, str) else repr(fam)
