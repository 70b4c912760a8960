"""Grouped and depthwise convolution through an exported library on a GPU: a library of one GEMM kernel, sm80 f16
fprop / dgrad / wgrad, the two grouped fprop kernels of configs/conv/verify_set.yaml (group_mode single and
multiple), an alignment-2 analytic strided dgrad (3 stages) and an alignment-1 wgrad (a depthwise group's one channel), built with CMake; conv2d(groups=g) against F.conv2d(groups=g) (cuDNN) on a grouped kernel where one
takes the problem and as one launch a group otherwise; conv2d_input_grad / conv2d_weight_grad with groups (one
dgrad / wgrad launch a group on channel slices) and conv2d's autograd against torch's gradients; groups = C
(depthwise) in every op.

$EMITTER_CONV_GROUPED_LIBRARY: an exported and built tree to use instead of building one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import CONV_SM80_F16_ENTRY, GEMM_SPEC_NO_SWIZZLE, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "convgroups"

SPEC = GEMM_SPEC_NO_SWIZZLE + CONV_SM80_F16_ENTRY + """\
  - family: conv
    arch: sm80
    op: fprop
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x64x64
    warp: 64x32x64
    stages: 3
    group_mode: single
  - family: conv
    arch: sm80
    op: fprop
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 64x64x32
    warp: 32x32x32
    stages: 2
    iterator: analytic
    alignment: {a: 1, b: 1, c: 8}
    group_mode: multiple
  - family: conv
    arch: sm80
    op: dgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 64x64x32
    warp: 32x32x32
    stages: 3
    iterator: analytic
    stride_support: strided
    alignment: {a: 2, b: 2, c: 2}
  - family: conv
    arch: sm80
    op: wgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 64x64x32
    warp: 32x32x32
    stages: 2
    iterator: analytic
    alignment: {a: 1, b: 1, c: 1}
"""


def _run(cmd, log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    assert r.returncode == 0, f"{cmd[:4]} failed; see {log}"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("needs an sm_80+ GPU visible to torch")
    given = os.environ.get("EMITTER_CONV_GROUPED_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("conv_grouped_library_gpu")
        log = Path(os.environ.get("OUT", work)) / "conv_grouped_library_build.log"
        spec = work / "spec.yaml"
        spec.write_text(SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", str(spec), "-o", str(work / "gen")], log)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree)], log)
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        archs = "80;90" if torch.cuda.get_device_capability(0) == (9, 0) else "80"
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
              "-DCMAKE_BUILD_TYPE=Release"], log)
        _run(["cmake", "--build", str(tree / "build"), "-j", os.environ.get("EMITTER_TEST_JOBS", "16")], log)
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def cl(torch, *shape):
    return torch.randn(*shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)


def _close(got, want, what: str) -> None:
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-6)).item()
    assert err < 1e-2, f"{what}: max relative error {err:.3e}"


# (N, C, H, W, K, groups, R, stride, padding, the grouped kernel that takes it: "single" / "multiple" / "slices" = none)
CASES = [
    (2, 96, 14, 14, 256, 4, 3, 1, 1, "single"),        # K/g = 64 = the single kernel's tile n
    (2, 48, 15, 13, 128, 2, 3, 2, 1, "multiple"),      # K/g = 64: both grouped kernels; C/g = 24
    (2, 64, 16, 16, 64, 64, 3, 1, 1, "multiple"),      # depthwise
    (2, 32, 15, 13, 32, 32, 3, 2, 1, "multiple"),      # depthwise stride 2: dgrad as a zero-inserted fprop
    (2, 64, 12, 12, 64, 4, 3, 2, 1, "multiple"),       # K/g = 16 divides tile n 64
    (2, 64, 9, 9, 96, 2, 1, 1, 0, "slices"),           # K/g = 48: neither grouped kernel; one launch a group
]


@pytest.mark.parametrize("case", CASES, ids=[f"g{c[5]}_{c[-1]}" for c in CASES])
def test_grouped_conv2d_and_grads_against_torch(lib, case):
    import torch
    import torch.nn.functional as F

    n, c, h, w_, k, g, r, stride, pad, route = case
    x, w = cl(torch, n, c, h, w_), cl(torch, k, c // g, r, r)
    sel = lib.conv_select("fprop", x, w, None, stride=stride, padding=pad, groups=g)
    # which kernels take the problem as given (the loader's cost model then picks the route: a grouped kernel, a
    # launch a group or the block-diagonal dense weight; test_conv_grouped_routes_gpu.py runs each)
    assert ("grouped" in sel["costs_us"]) == (route != "slices"), sel
    assert ("_group" in sel["kernel"]) == (sel["route"] == "grouped kernel"), sel
    y = lib.conv2d(x, w, stride=stride, padding=pad, groups=g)
    torch.cuda.synchronize()
    _close(y, F.conv2d(x, w, stride=stride, padding=pad, groups=g), f"conv2d {case}")
    xs, ws = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ys = F.conv2d(xs, ws, stride=stride, padding=pad, groups=g)
    gy = torch.randn_like(ys).half().contiguous(memory_format=torch.channels_last)
    gx, gw = torch.autograd.grad(ys, (xs, ws), grad_outputs=gy.float())
    _close(lib.conv2d_input_grad(gy, w, x.shape, stride=stride, padding=pad, groups=g), gx, f"dgrad {case}")
    _close(lib.conv2d_weight_grad(x, gy, w.shape, stride=stride, padding=pad, groups=g), gw, f"wgrad {case}")


def test_grouped_conv2d_autograd_against_torch(lib):
    import torch
    import torch.nn.functional as F

    x = cl(torch, 2, 64, 14, 14).requires_grad_()
    w = (cl(torch, 64, 1, 3, 3) * 0.3).requires_grad_()           # depthwise, then a grouped 1x1
    w2 = (cl(torch, 128, 16, 1, 1) * 0.3).requires_grad_()
    y = lib.conv2d(lib.conv2d(x, w, padding=1, groups=64), w2, groups=4)
    gy = torch.randn_like(y)
    y.backward(gy)
    xs, ws, w2s = (t.detach().float().requires_grad_() for t in (x, w, w2))
    F.conv2d(F.conv2d(xs, ws, padding=1, groups=64), w2s, groups=4).backward(gy.float())
    for got, want, what in ((x.grad, xs.grad, "x"), (w.grad, ws.grad, "w"), (w2.grad, w2s.grad, "w2")):
        _close(got, want, f"autograd {what}")


def test_grouped_refusals_are_clear(lib):
    import torch

    x = cl(torch, 2, 48, 9, 9)
    with pytest.raises(lib.OperandError, match="must divide"):
        lib.conv2d(x, cl(torch, 64, 16, 3, 3), groups=5)
    with pytest.raises(lib.OperandError, match=r"\(K, C/groups, R, S\)"):
        lib.conv2d(x, cl(torch, 64, 48, 3, 3), groups=4)      # groups divide C and K; w's C/groups is not 12
