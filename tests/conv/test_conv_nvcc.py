"""Conv family (issue 28): compile ONE real sm80 and ONE real sm90a conv instance through `emitter build`, then ask
their host shims (ctypes, no GPU needed for can_implement) what they can run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.families.conv.abi import ConvShim, c_problem_from
from emitter.families.conv.problem import ConvProblem
from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_CUDA_ERROR, EMITTER_OK

SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: fprop
    dtype: f16
    tile: 128x128x64
    warp: 64x64x64
    stages: 3
  - family: conv
    arch: sm90a
    op: fprop
    dtype: f16
    tile: 128x128x64
    cluster: 1x1x1
"""

RESNET = ConvProblem(n=128, h=56, w=56, c=64, k=64, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
PTRS = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convbuild")
    (tmp / "spec.yaml").write_text(SPEC)
    out = tmp / "gen"
    run = [sys.executable, "-m", "emitter"]
    r = subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["build", str(out), "-j", "2", "--cache-dir", str(tmp / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    return out, {e["arch"]: e["name"] for e in manifest["instances"]}


def _shim(out: Path, name: str) -> ConvShim:
    rec = json.loads((out / "build" / name / "record.json").read_text())
    assert rec["status"] in ("ok", "cached"), rec.get("error")
    assert rec["resources"]["spill_bytes"] == 0
    cubin = (out / rec["artifacts"]["cubin"]).read_bytes()
    assert f"emitter_{name}_kernel".encode() in cubin
    return ConvShim(out / rec["artifacts"]["host"], name)


@pytest.mark.nvcc
def test_sm80_conv_builds_and_answers_can_implement(built):
    out, names = built
    shim = _shim(out, names["sm80"])
    status, launch = shim.query(c_problem_from(RESNET, PTRS))
    assert status == EMITTER_OK
    d = launch.as_dict()
    assert d["grid"] == [128 * 56 * 56 // 128, 1, 1] and d["block"] == [128, 1, 1]
    assert d["params_bytes"] > 0 and d["workspace_bytes"] == 0
    assert shim.query(c_problem_from(ConvProblem(n=2, h=9, w=9, c=3, k=64, r=3, s=3), PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    assert shim.query(c_problem_from(ConvProblem(n=2, h=9, w=9, c=64, k=60, r=3, s=3), PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    bias = dict(PTRS, bias=1 << 23)
    from dataclasses import replace
    assert shim.query(c_problem_from(replace(RESNET, bias=True), bias))[0] == EMITTER_CANNOT_IMPLEMENT
    strided = ConvProblem(n=4, h=23, w=21, c=64, k=64, r=7, s=7, pad_front=(0, 3, 3), pad_back=(0, 2, 3), stride=(1, 2, 2))
    assert shim.query(c_problem_from(strided, PTRS))[0] == EMITTER_OK


@pytest.mark.nvcc
def test_sm90a_conv_builds_and_answers_can_implement(built):
    out, names = built
    shim = _shim(out, names["sm90a"])
    # can_implement runs before the shim asks the device for its SM count: without a GPU that is a CUDA error
    status, launch = shim.query(c_problem_from(RESNET, PTRS))
    assert status in (EMITTER_OK, EMITTER_CUDA_ERROR)
    if status == EMITTER_OK:
        assert launch.params_align == 128
    assert shim.query(c_problem_from(ConvProblem(n=2, h=9, w=9, c=3, k=64, r=3, s=3), PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    big_pad = ConvProblem(n=1, h=9, w=9, c=64, k=64, r=3, s=3, pad_front=(0, 300, 1), pad_back=(0, 300, 1))
    assert shim.query(c_problem_from(big_pad, PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
