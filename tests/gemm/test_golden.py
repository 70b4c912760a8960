"""Golden files per template level. After an intended template change: `make golden`, review the diff."""

import os
from pathlib import Path

import pytest

from emitter.families.gemm import arch_module, template_dir
from emitter.render import banner, render_template
from tests.instances import GOLDEN_SPECS, resolve_text

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "gemm"
UPDATE = os.environ.get("EMITTER_UPDATE_GOLDEN") == "1"


def _cases():
    for arch in GOLDEN_SPECS:
        try:
            levels = arch_module_for(arch).LEVELS
        except Exception:  # the arch module must exist; fail below with a clear message
            levels = ("<missing>",)
        for level in levels:
            yield arch, level


def arch_module_for(arch: str):
    from emitter.families.gemm.model import Arch
    return arch_module(Arch[arch])


@pytest.mark.parametrize("arch,level", list(_cases()))
def test_level_matches_golden(tmp_path, arch, level):
    [r], rejected = resolve_text(tmp_path, GOLDEN_SPECS[arch])
    assert not rejected
    inst = r.instance
    module = arch_module(inst.arch)
    text = render_template(f"{template_dir(inst.arch)}/{level}.cu.j2", inst=inst, name=r.name,
                           ctx=module.template_context(inst), banner=banner("golden.yaml", "0" * 64))
    path = GOLDEN / arch / f"{level}.cu"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: run `make golden` and review it"
    assert text == path.read_text(), f"{level} level of {arch} differs from {path}; if intended, `make golden`"


@pytest.mark.parametrize("arch", list(GOLDEN_SPECS))
def test_instance_includes_every_level_in_order(tmp_path, arch):
    [r], _ = resolve_text(tmp_path, GOLDEN_SPECS[arch])
    module = arch_module(r.instance.arch)
    whole = render_template(f"{template_dir(r.instance.arch)}/instance.cu.j2", inst=r.instance, name=r.name,
                            ctx=module.template_context(r.instance), banner=banner("golden.yaml", "0" * 64))
    positions = []
    for level in module.LEVELS:
        part = render_template(f"{template_dir(r.instance.arch)}/{level}.cu.j2", inst=r.instance, name=r.name,
                               ctx=module.template_context(r.instance), banner=banner("golden.yaml", "0" * 64))
        body = part.strip()
        assert body and body in whole, f"level {level} is not in the instance file"
        positions.append(whole.index(body))
    assert positions == sorted(positions), "levels appear out of composition order"
    assert "generated" in whole[:600] and "do not edit" in whole[:600]
    assert f"emitter_{r.name}_kernel" in whole
