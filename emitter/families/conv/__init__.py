"""Convolution family (implicit GEMM): spec parsing (spec.py), instance model (model.py), naming, one module per
CUTLASS generation -- sm80.py (2.x DefaultConv{2,3}d{Fprop,Dgrad,Wgrad}) and sm90a.py (3.x conv collective
builder + ConvUniversal) -- and the run-time pieces (problem, inputs, reference, fake, flops, abi, runner, runtime)."""

from __future__ import annotations

import importlib
from types import ModuleType

from emitter.families.conv.model import Arch

_MODULE_FOR_MAJOR = {2: "sm80", 3: "sm90a"}


def arch_module(arch: Arch) -> ModuleType:
    return importlib.import_module(f"emitter.families.conv.{_MODULE_FOR_MAJOR[arch.cutlass_major]}")


def template_dir(arch: Arch) -> str:
    return f"conv/{_MODULE_FOR_MAJOR[arch.cutlass_major]}"


# ---- the emit-side family hooks (emitter.families.base) ----
from emitter.families.conv.naming import instance_name  # noqa: E402
from emitter.families.conv.spec import expand_entry  # noqa: E402
from emitter.families.conv.library import library_pieces  # noqa: E402,F401  (emitter library's plug)


def resolve(cand):  # -> ConvInstance | Rejection
    from emitter.families.conv.sm80_depthwise import misplaced_keys
    return misplaced_keys(cand) or arch_module(cand.arch).resolve(cand)


def render_instance(inst, name: str, banner: str) -> str:
    from emitter.render import render_template
    # kernel: gemm_1x1 (sm90a): the 1x1 conv as a persistent GEMM, its own level templates beside the conv kernel's
    top = {"gemm_1x1": "gemm1x1_instance.cu.j2",                  # the direct depthwise kernel: its own levels (sm80)
           "depthwise_direct": "depthwise_instance.cu.j2",
           "depthwise_simt": "depthwise_simt_instance.cu.j2"}.get(inst.kernel.value, "instance.cu.j2")
    if inst.arch.cutlass_major == 3 and inst.split_k.value == "parallel":   # sm90a wgrad split over the SMs
        top = "splitk_instance.cu.j2"
    return render_template(f"{template_dir(inst.arch)}/{top}", inst=inst, name=name,
                           ctx=arch_module(inst.arch).template_context(inst), banner=banner)
