"""Conv family (issue 28): rendered instances, level by level, against golden files (tests/golden/conv/<arch>/<op>/
<level>.cu; after an intended template change: EMITTER_UPDATE_GOLDEN=1 pytest tests/conv/test_conv_render.py, review
the diff), the levels in order in the instance, and no spec text reaching C++."""

import os
import re
import textwrap
from pathlib import Path

import pytest

from emitter.emit import spec_entries
from emitter.families.conv import arch_module, instance_name, render_instance, resolve, template_dir
from emitter.families.conv.spec import expand_entry
from emitter.render import banner, render_template
from emitter.spec.loader import parse_text

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "conv"
UPDATE = os.environ.get("EMITTER_UPDATE_GOLDEN") == "1"

SPECS = {
    ("sm80", "fprop"): "arch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\nstages: 3\n",
    ("sm80", "wgrad"): "arch: sm80\nop: wgrad\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\nsplit_k: serial\n",
    ("sm80", "dgrad"): "arch: sm80\nop: dgrad\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\nstride_support: strided\n",
    ("sm80", "group_single"): "arch: sm80\nop: fprop\ndtype: f16\ntile: 128x64x64\nwarp: 64x32x64\nstages: 3\n"
                              "group_mode: single\n",
    ("sm80", "group_multiple"): "arch: sm80\nop: fprop\ndtype: f16\ntile: 64x64x32\nwarp: 32x32x32\nstages: 2\n"
                                "iterator: analytic\ngroup_mode: multiple\nalignment: {a: 1, b: 1, c: 8}\n",
    ("sm90a", "fprop"): "arch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\ncluster: 1x1x1\n",
    ("sm90a", "wgrad"): "arch: sm90a\nop: wgrad\ndtype: bf16\ntile: 128x128x64\n",
}


def resolved(text: str):
    doc = parse_text("family: conv\n" + textwrap.dedent(text), "golden.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(expand_entry(doc, path, entry, kp))
    inst = resolve(cand)
    assert not hasattr(inst, "rule"), inst
    return inst


CASES = [(arch, op, level) for (arch, op) in SPECS for level in arch_module(resolved(SPECS[(arch, op)]).arch).LEVELS]


@pytest.mark.parametrize("arch,op,level", CASES)
def test_level_matches_golden(arch, op, level):
    inst = resolved(SPECS[(arch, op)])
    text = render_template(f"{template_dir(inst.arch)}/{level}.cu.j2", inst=inst, name=instance_name(inst),
                           ctx=arch_module(inst.arch).template_context(inst), banner=banner("golden.yaml", "0" * 64))
    path = GOLDEN / arch / op / f"{level}.cu"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: EMITTER_UPDATE_GOLDEN=1 pytest {__file__}"
    assert text == path.read_text(), f"{level} level of {arch} {op} differs from {path}"


@pytest.mark.parametrize("key", list(SPECS))
def test_instance_has_every_level_in_order_and_one_using_each(key):
    inst = resolved(SPECS[key])
    name = instance_name(inst)
    text = render_instance(inst, name, banner("golden.yaml", "0" * 64))
    levels = arch_module(inst.arch).LEVELS
    pos = []
    for i, lv in enumerate(levels):
        m = re.search(rf"^// level {i + 1}: ([^\n]*)$", text, re.M)
        assert m and lv.lower() in m.group(1).lower(), (lv, m and m.group(0))
        pos.append(m.start())
    assert pos == sorted(pos)
    assert f'extern "C" __global__' in text and f"emitter_{name}_kernel" in text
    assert f"emitter_{name}_query" in text and f"emitter_{name}_conv_abi" in text
    assert "EMITTER_CONV_ABI_VERSION 1" in text
    if inst.arch.yaml == "sm90a":
        assert "__grid_constant__" in text and "cutlass/kernel_hardware_info.h" in text
        assert re.search(r"using TileShape = cute::Shape<cute::_128, .*cute::Shape<cute::_64>>;", text)
        assert "KernelImplicitTmaWarpSpecializedSm90" in text and "cutlass::conv::kernel::ConvUniversal" in text
        if inst.op.value == "wgrad":
            assert "cute::Shape<cute::_128>, cute::Shape<cute::_64>>" in text and "TensorKCSR" in text
    else:
        for using in ("using InstructionShape", "using WarpShape", "using ThreadblockShape", "using EpilogueOutputOp",
                      "using ConvKernel", "using ThreadblockMma", "using WarpMma", "using Epilogue ="):
            assert using in text, using
        assert "cutlass::conv::kernel::DefaultConv2d" in text


def test_spec_text_never_reaches_cpp(tmp_path):
    """A spec's name/description and file name only reach // comments (sanitized), never code."""
    inst = resolved(SPECS[("sm80", "fprop")])
    evil = "x\n#include </etc/passwd>\n\\"
    text = render_instance(inst, instance_name(inst), banner(evil, "0" * 64))
    assert not any(line.lstrip().startswith("#include </etc") for line in text.splitlines())
    assert all(line.startswith("//") for line in text.splitlines() if "passwd" in line)
