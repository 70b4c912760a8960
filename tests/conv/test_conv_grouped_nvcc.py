"""Grouped conv fprop (sm80 DefaultConv2dGroupFprop): compile one group_mode single and one group_mode multiple
instance (the latter at alignment 1, the depthwise route: one channel a group) through `emitter build`, then ask
their host shims (ctypes, no GPU needed) which grouped problems they accept."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emitter.families.conv.abi import ConvShim, c_problem_from
from emitter.families.conv.problem import ConvProblem
from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_INVALID_ARGUMENT, EMITTER_OK

SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: fprop
    dtype: f16
    tile: 128x64x64
    warp: 64x32x64
    stages: 3
    group_mode: single
  - family: conv
    arch: sm80
    op: fprop
    dtype: f16
    tile: 64x64x32
    warp: 32x32x32
    stages: 2
    iterator: analytic
    alignment: {a: 1, b: 1, c: 8}
    group_mode: multiple
"""

PTRS = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convgroupbuild")
    (tmp / "spec.yaml").write_text(SPEC)
    out = tmp / "gen"
    run = [sys.executable, "-m", "emitter"]
    r = subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["build", str(out), "-j", "1", "--cache-dir", str(tmp / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    return out, {e["config"]["group_mode"]: e["name"] for e in manifest["instances"]}


def _shim(out: Path, name: str) -> ConvShim:
    rec = json.loads((out / "build" / name / "record.json").read_text())
    assert rec["status"] in ("ok", "cached"), rec.get("error")
    assert rec["resources"]["spill_bytes"] == 0
    assert f"emitter_{name}_kernel".encode() in (out / rec["artifacts"]["cubin"]).read_bytes()
    return ConvShim(out / rec["artifacts"]["host"], name)


def _status(shim: ConvShim, p: ConvProblem) -> int:
    return shim.query(c_problem_from(p, PTRS))[0]


@pytest.mark.nvcc
def test_single_group_instance_builds_and_runs_grouped_problems_only(built):
    out, names = built
    shim = _shim(out, names["single"])
    p = ConvProblem(n=2, h=14, w=14, c=4 * 24, k=4 * 64, groups=4, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    status, launch = shim.query(c_problem_from(p, PTRS))
    assert status == EMITTER_OK
    assert launch.as_dict()["grid"][:2] == [-(-2 * 14 * 14 // 128), 4]      # N tiles: one group of 64 channels each
    from dataclasses import replace
    assert _status(shim, replace(p, groups=1)) == EMITTER_CANNOT_IMPLEMENT          # ungrouped: other instances
    assert _status(shim, replace(p, k=4 * 32)) == EMITTER_CANNOT_IMPLEMENT          # K/groups 32: not a tile n multiple
    assert _status(shim, replace(p, c=4 * 20)) == EMITTER_CANNOT_IMPLEMENT          # C/groups 20: not 8-aligned
    assert _status(shim, replace(p, c=4 * 24 + 1)) == EMITTER_INVALID_ARGUMENT      # groups must divide C


@pytest.mark.nvcc
def test_multiple_group_instance_runs_depthwise(built):
    out, names = built
    shim = _shim(out, names["multiple"])
    depthwise = ConvProblem(n=2, h=11, w=13, c=40, k=40, groups=40, r=3, s=3, pad_front=(0, 1, 1),
                            pad_back=(0, 1, 1), stride=(1, 2, 2))
    assert _status(shim, depthwise) == EMITTER_OK
    assert _status(shim, ConvProblem(n=2, h=9, w=9, c=6, k=64, groups=2, r=3, s=3)) == EMITTER_OK        # 32 a group
    assert _status(shim, ConvProblem(n=2, h=9, w=9, c=6, k=48, groups=2, r=3, s=3)) == EMITTER_CANNOT_IMPLEMENT  # 24
