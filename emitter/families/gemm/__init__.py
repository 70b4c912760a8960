"""GEMM family: spec parsing (spec.py), instance model (model.py), naming, and one module per CUTLASS
generation: sm80.py (CUTLASS 2.x: sm75, sm80, sm86, sm89) and sm90a.py (CUTLASS 3.x collectives)."""

from __future__ import annotations

import importlib
from types import ModuleType

from emitter.families.gemm.model import Arch

_MODULE_FOR_MAJOR = {2: "sm80", 3: "sm90a"}


def arch_module(arch: Arch) -> ModuleType:
    """The module that resolves, checks and renders instances of this arch."""
    return importlib.import_module(f"emitter.families.gemm.{_MODULE_FOR_MAJOR[arch.cutlass_major]}")


def template_dir(arch: Arch) -> str:
    return f"gemm/{_MODULE_FOR_MAJOR[arch.cutlass_major]}"


# ---- the emit-side family hooks (emitter.families.base) ----
from emitter.families.gemm.naming import instance_name  # noqa: E402
from emitter.families.gemm.spec import expand_entry  # noqa: E402


def resolve(cand):  # -> GemmInstance | Rejection
    return arch_module(cand.arch).resolve(cand)


def render_instance(inst, name: str, banner: str) -> str:
    from emitter.render import render_template
    return render_template(f"{template_dir(inst.arch)}/instance.cu.j2", inst=inst, name=name,
                           ctx=arch_module(inst.arch).template_context(inst), banner=banner)


def library_pieces(entries, roots, ctx):  # -> emitter.kit.library.LibraryPieces
    """GEMM's part of an exported library (emitter/families/gemm/library.py); imported when an export runs."""
    from emitter.families.gemm.library import library_pieces as pieces

    return pieces(entries, roots, ctx)
