"""Attention family (fused multi-head attention, forward): spec parsing (spec.py), instance model
(model.py), naming, and one module per kernel lineage: sm80.py (CUTLASS examples/41, the xFormers kernel,
also runnable on Hopper) and sm90a.py (CUTLASS examples/88, the Hopper FMHA collectives).

Emit-side hooks (emitter.families.base): expand_entry, resolve, instance_name, render_instance.
resolve / render dispatch on the instance's arch; sm90a.py is imported lazily, so the family works (and
rejects sm90a candidates with a reason) before that module exists.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from emitter.families.attention.model import Arch, AttentionInstance, Rejection

_MODULE = {Arch.sm80: "sm80", Arch.sm90a: "sm90a"}


def arch_module(arch: Arch) -> ModuleType | None:
    """The module that resolves, checks and renders instances of this arch (None: not there yet)."""
    try:
        return importlib.import_module(f"emitter.families.attention.{_MODULE[arch]}")
    except ModuleNotFoundError as e:
        if e.name == f"emitter.families.attention.{_MODULE[arch]}":
            return None
        raise


def template_dir(arch: Arch) -> str:
    return f"attention/{_MODULE[arch]}"


# ---- the emit-side family hooks (emitter.families.base) ----
from emitter.families.attention import backward_model as _bwd  # noqa: E402
from emitter.families.attention.naming import instance_name as _forward_name  # noqa: E402
from emitter.families.attention import spec as _spec  # noqa: E402
from emitter.families.attention.backward_spec import expand_op_entry as _expand_op_entry  # noqa: E402


def expand_entry(doc: Any, path: Any, entry: Any, key_paths: Any = None) -> Any:
    """Yield (candidate instance, sweep point) for one `family: attention` spec entry: one with an `op` axis
    (forward / backward) through backward_spec, the others through spec (which checks the entry's shape and
    family first, for both)."""
    if isinstance(entry, dict) and entry.get("family") == "attention" and "op" in entry:
        yield from _expand_op_entry(doc, path, entry, key_paths)
    else:
        yield from _spec.expand_entry(doc, path, entry, key_paths)

_BACKWARD_MODULE = {Arch.sm80: "backward_sm80", Arch.sm90a: "backward_sm90a"}   # op: backward, by arch (backward_*.py)


def instance_name(inst) -> str:
    return _bwd.instance_name(inst) if _bwd.is_backward(inst) else _forward_name(inst)


def _backward_module(arch: Arch) -> ModuleType | None:
    name = _BACKWARD_MODULE.get(arch)
    return importlib.import_module(f"emitter.families.attention.{name}") if name else None


def resolve(cand: AttentionInstance):  # -> AttentionInstance | Rejection
    if _bwd.is_backward(cand):
        mod = _backward_module(cand.arch)
        if mod is None:
            return Rejection(cand, "backward-arch-not-available",
                             f"the attention backward for {cand.arch} is not available in this emitter yet: use arch "
                             f"{', '.join(a.yaml for a in _BACKWARD_MODULE)} (its kernel also runs on newer GPUs)")
        return mod.resolve(cand)
    mod = arch_module(cand.arch)
    if mod is None or not hasattr(mod, "resolve"):
        return Rejection(cand, "arch-not-available",
                         f"attention kernels for {cand.arch} are not available in this emitter yet "
                         f"(emitter/families/attention/{_MODULE[cand.arch]}.py): use arch sm80")
    return mod.resolve(cand)


def render_instance(inst: AttentionInstance, name: str, banner: str) -> str:
    from emitter.render import render_template
    if _bwd.is_backward(inst):
        return _backward_module(inst.arch).render(inst, name, banner)
    mod = arch_module(inst.arch)
    if mod is None:
        raise ValueError(f"no attention module for {inst.arch}")
    return render_template(f"{template_dir(inst.arch)}/instance.cu.j2", inst=inst, name=name,
                           ctx=mod.template_context(inst), banner=banner)


def include_dirs(arch) -> list:
    """Extra include directories the build adds for an instance of this arch (emitter.build.builder's
    family_include_flags): the arch module's include_dirs(), if it has one."""
    try:
        a = arch if isinstance(arch, Arch) else Arch[str(arch)]
    except KeyError:
        return []
    mod = arch_module(a)
    hook = getattr(mod, "include_dirs", None) if mod is not None else None
    return list(hook(a)) if hook is not None else []


from emitter.families.attention.library import library_pieces  # noqa: E402,F401  (emitter library plug)

__all__ = ["arch_module", "include_dirs", "template_dir", "expand_entry", "resolve", "instance_name", "render_instance"]
