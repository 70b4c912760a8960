"""The depthwise direct kernel (`kernel: depthwise_direct`, sm80): compile one instance (f16, 3x3, stride 1, 8x8 output
tile x 64 channels) through `emitter build`, then ask its host shim (ctypes, no GPU) what it accepts and how it
launches, and check that problem.not_supported_reasons says the same as the shim for every problem asked."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from emitter.families.conv.abi import ConvShim, c_problem_from
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.sm80_depthwise import smem_bytes
from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_INVALID_ARGUMENT, EMITTER_OK

SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: fprop
    dtype: f16
    kernel: depthwise_direct
    filter: 3x3
    stride: 1
    tile: 8x8x64
"""
PTRS = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convdwbuild")
    (tmp / "spec.yaml").write_text(SPEC)
    out = tmp / "gen"
    run = [sys.executable, "-m", "emitter"]
    r = subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["build", str(out), "-j", "1", "--cache-dir", str(tmp / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
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


@pytest.mark.nvcc
def test_direct_instance_launch_workspace_and_ctas(built):
    shim, _cfg = built
    p = dw()
    status, launch = shim.query(c_problem_from(p, PTRS))
    assert status == EMITTER_OK
    d = launch.as_dict()
    tiles = 2 * 2 * 2                                      # N x ceil(13/8) x ceil(11/8) output tiles
    assert d["grid"] == [1, 3, tiles]                      # 144 channels: 3 blocks of 64; a CTA an output tile
    assert d["block"] == [128, 1, 1]                       # 8x8 pixels / 16 a warp = 4 warps
    assert d["workspace_bytes"] == -(-144 * 9 * 2 // 256) * 256     # the reordered [R*S][K] filter
    # 4 stages of the larger of the 10x10 input window (7 rounds of 128 threads' 16-byte loads) and the epilogue's
    # 8x8x64 f32 staging, + the filter (one round): what the spec's smem rule computes (sm80_depthwise.smem_bytes)
    assert d["shared_bytes"] == 4 * max(7 * 128 * 16, 8 * 8 * 64 * 4) + 128 * 16 == 67584
    assert d["shared_bytes"] == smem_bytes((8, 8, 64), (3, 3), 16, (1, 1), (1, 1), 4, 2, 4)
    wide = dw(stride=(1, 2, 2), dilation=(1, 2, 2))        # refused here (stride 1 compiled): the formula alone
    assert smem_bytes((8, 8, 64), (3, 3), 16, (2, 2), (2, 2), 3, 2, 4) == 3 * 23 * 128 * 16 + 128 * 16
    assert shim.query(c_problem_from(wide, PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    # a CTA walking several tiles races in CUTLASS's fused epilogue (depthwise_device.cu.j2): no CTA count of the
    # caller's (split_k), one CTA a tile however large the problem, up to the grid's 65535 along z
    assert shim.query(c_problem_from(replace(p, split_k=3), PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    big = dw(c=384, n=128, h=56, w=56)                     # 6272 tiles
    status, launch = shim.query(c_problem_from(big, PTRS))
    assert status == EMITTER_OK and launch.as_dict()["grid"] == [1, 6, 6272]
    most = dw(n=65535, h=8, w=8)                           # 65535 tiles of 8x8
    assert shim.query(c_problem_from(most, PTRS))[0] == EMITTER_OK and not not_supported_reasons(_cfg.cfg, most)
    over = dw(n=65536, h=8, w=8)
    assert shim.query(c_problem_from(over, PTRS))[0] == EMITTER_CANNOT_IMPLEMENT
    assert not_supported_reasons(_cfg.cfg, over)


@pytest.mark.nvcc
def test_direct_instance_refuses_what_it_cannot_run_as_not_supported_reasons_says(built):
    shim, cfg = built
    refused = {
        "ungrouped": replace(dw(), groups=1),
        "grouped": replace(dw(), groups=72),
        "multiplier 2": replace(dw(), k=288),
        "filter 5x5": dw(r=5, s=5, pad_front=(0, 2, 2), pad_back=(0, 2, 2)),
        "stride 2": dw(stride=(1, 2, 2)),
        "dilation 2": dw(dilation=(1, 2, 2)),
        "C % 8": dw(c=20),
        "bias": replace(dw(), bias=True),
        "3D": dw(d=3, t=1),
        "split_k 3": replace(dw(), split_k=3),
        "65536 tiles": dw(n=16384, h=32, w=32),
    }
    for what, p in refused.items():
        status, _ = shim.query(c_problem_from(p, {**PTRS, "bias": 1 << 23} if p.bias else PTRS))
        assert status == EMITTER_CANNOT_IMPLEMENT, what
        assert not_supported_reasons(cfg.cfg, p), what
    for p, _data in default_problems(cfg.cfg):
        assert shim.query(c_problem_from(p, PTRS))[0] == EMITTER_OK, p.label()
    assert shim.query(c_problem_from(replace(dw(), groups=7), PTRS))[0] == EMITTER_INVALID_ARGUMENT  # 7 divides no C


@pytest.mark.nvcc
def test_direct_instance_checks_strides_and_pointers(built):
    shim, _cfg = built
    p = dw()
    q = p.output_extents()
    cp = c_problem_from(p, PTRS)
    cp.stride_y[3] = 152                                   # a padded output row: allowed, the kernel steps by it
    assert shim.query(cp)[0] == EMITTER_OK
    cp.stride_y[2] = q[2] * 152 + 8                        # rows not packed: the output iterator cannot step them
    assert shim.query(cp)[0] == EMITTER_CANNOT_IMPLEMENT
    cp = c_problem_from(p, PTRS)
    cp.stride_w[0] = 10                                    # a filter not packed K x R x S x 1
    assert shim.query(cp)[0] == EMITTER_CANNOT_IMPLEMENT
    cp = c_problem_from(p, PTRS)
    cp.stride_x[3] = 100                                   # an x row shorter than C
    assert shim.query(cp)[0] == EMITTER_INVALID_ARGUMENT
    cp = c_problem_from(p, {**PTRS, "x": (1 << 20) + 2})   # x not 16-byte aligned
    assert shim.query(cp)[0] == EMITTER_CANNOT_IMPLEMENT
