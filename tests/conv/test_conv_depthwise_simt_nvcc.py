"""emitter's SIMT depthwise kernel (`kernel: depthwise_simt`, sm80): compile the f16 3x3 wgrad instance through
`emitter build` (no spills, no warnings), then ask its host shim (ctypes, no GPU) what it accepts, its grid and its
workspace (the slices' f32 partial sums and the reduction's tickets), and check that problem.not_supported_reasons
says the same as the shim."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from emitter.families.conv.abi import ConvShim, c_problem_from
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_INVALID_ARGUMENT, EMITTER_OK

SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: wgrad
    dtype: f16
    kernel: depthwise_simt
    filter: 3x3
    tile: 32x1x64
"""
PTRS = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convdwsimtbuild")
    (tmp / "spec.yaml").write_text(SPEC)
    out = tmp / "gen"
    run = [sys.executable, "-m", "emitter"]
    r = subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["build", str(out), "-j", "1", "--cache-dir", str(tmp / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (entry,) = json.loads((out / "manifest.json").read_text())["instances"]
    rec = json.loads((out / "build" / entry["name"] / "record.json").read_text())
    assert rec["status"] in ("ok", "cached"), rec.get("error")
    assert rec["resources"]["spill_bytes"] == 0 and rec["warnings"] == []
    assert f"emitter_{entry['name']}_kernel".encode() in (out / rec["artifacts"]["cubin"]).read_bytes()
    return ConvShim(out / rec["artifacts"]["host"], entry["name"]), ConvConfig.from_entry(entry)


def dw(c=144, **kw) -> ConvProblem:
    geo = dict(n=2, h=13, w=11, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    geo.update(kw)
    return ConvProblem(c=c, k=c, groups=c, **geo)


def _round(v: int) -> int:
    return -(-v // 256) * 256


@pytest.mark.nvcc
def test_wgrad_grid_and_workspace(built):
    shim, _cfg = built
    status, launch = shim.query(c_problem_from(dw(), PTRS))
    assert status == EMITTER_OK
    d = launch.as_dict()
    # 286 positions: at least 4 a thread of 32 rows -> 3 slices of 96 (the last short); 144 channels: 3 blocks of 64
    assert d["grid"] == [3, 3, 1] and d["block"] == [256, 1, 1] and d["shared_bytes"] == 0
    assert d["workspace_bytes"] == _round(3 * 9 * 144 * 4) + _round(3 * 1 * 2 * 4)
    big = dw(n=32, h=56, w=56)     # 1056 CTAs wanted over 3 channel blocks: 352 slices of 286 positions = 351
    d = shim.query(c_problem_from(big, PTRS))[1].as_dict()
    slices = d["grid"][1]
    groups = -(-slices // 16)
    assert d["grid"] == [3, 351, 1]
    assert d["workspace_bytes"] == _round(slices * 9 * 144 * 4) + _round(groups * 9 * 144 * 4) + _round(3 * (groups + 1) * 4)


@pytest.mark.nvcc
def test_wgrad_refuses_what_it_cannot_run_as_not_supported_reasons_says(built):
    shim, cfg = built
    refused = {
        "ungrouped": replace(dw(), groups=1),
        "grouped": replace(dw(), groups=72),
        "multiplier 2": replace(dw(), k=288),
        "filter 5x5": dw(r=5, s=5, pad_front=(0, 2, 2), pad_back=(0, 2, 2)),
        "C % 8": dw(c=20),
        "3D": dw(d=3, t=1),
        "split_k 3": replace(dw(), split_k=3),
    }
    for what, p in refused.items():
        status, _ = shim.query(c_problem_from(p, PTRS))
        assert status == EMITTER_CANNOT_IMPLEMENT, what
        assert not_supported_reasons(cfg.cfg, p), what
    for p in (dw(stride=(1, 2, 2)), dw(dilation=(1, 2, 2)), dw(pad_front=(0, 0, 3), pad_back=(0, 2, 0))):
        assert shim.query(c_problem_from(p, PTRS))[0] == EMITTER_OK and not not_supported_reasons(cfg.cfg, p)
    for p, _data in default_problems(cfg.cfg):
        assert shim.query(c_problem_from(p, PTRS))[0] == EMITTER_OK, p.label()
    assert shim.query(c_problem_from(replace(dw(), groups=7), PTRS))[0] == EMITTER_INVALID_ARGUMENT


@pytest.mark.nvcc
def test_wgrad_checks_strides_and_pointers(built):
    shim, _cfg = built
    p = dw()
    cp = c_problem_from(p, PTRS)
    cp.stride_x[3] = 152                                   # a padded x row: honoured
    cp.stride_w[0] = 16                                    # dw filters 16 apart: honoured (written one by one)
    assert shim.query(cp)[0] == EMITTER_OK
    cp.stride_x[3] = 148                                   # not a whole 16-byte vector: refused
    assert shim.query(cp)[0] == EMITTER_CANNOT_IMPLEMENT
    cp = c_problem_from(p, PTRS)
    cp.stride_x[3] = 100                                   # an x row shorter than C: the rows would overlap
    assert shim.query(cp)[0] == EMITTER_INVALID_ARGUMENT
    cp = c_problem_from(p, PTRS)
    cp.stride_w[0] = 5                                     # a filter shorter than its 9 taps
    assert shim.query(cp)[0] == EMITTER_INVALID_ARGUMENT
    cp = c_problem_from(p, {**PTRS, "x": (1 << 20) + 2})   # x not 16-byte aligned
    assert shim.query(cp)[0] == EMITTER_CANNOT_IMPLEMENT
