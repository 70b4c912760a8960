"""What every family shares: the Rejection record and the emit-side hooks a family package provides.

A family is a package `emitter.families.<name>` registered in `emitter.families.registry.FAMILIES`.
Emit-side hooks (module-level functions of the package; see docs/architecture.md "What a family provides"):

    expand_entry(doc, entry_path, entry, key_paths) -> Iterator[(candidate, sweep_point)]
        parse one spec entry (a mapping with `family: <name>`) into candidate instances; raise SpecError
        (via doc.error) for malformed input, naming file, line, key path, value, allowed, fix
    resolve(candidate) -> instance | Rejection
        fill derived fields, check every constraint before nvcc
    instance_name(instance) -> str
        the one deterministic name ([a-z0-9_]+): file name, C symbol, cache and manifest key
    render_instance(instance, name, banner) -> str
        the .cu text (templates/<family>/<arch>/instance.cu.j2 and its levels)

An instance is a frozen dataclass with `family` (str), `arch` (an enum with `.yaml`), `spec_file`,
`spec_index`, `spec_hash` (not part of identity), `replace(**changes)` and `config()` (plain JSON for the
manifest's `config`). Run-time hooks (verify, profile, library) are described in docs/architecture.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rejection:
    """A candidate that cannot work: which rule it broke, why, and how to fix it."""

    instance: Any
    rule: str      # stable id, e.g. "tile-k-multiple-of-instruction-k"
    reason: str    # "tile k=48 is not a multiple of instruction k=16: use 32 or 64"


EMIT_HOOKS = ("expand_entry", "resolve", "instance_name", "render_instance")
