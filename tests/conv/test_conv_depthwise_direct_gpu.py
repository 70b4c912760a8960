"""The depthwise direct kernel (`kernel: depthwise_direct`, sm80; Hopper runs the sm_80 build) on the GPU: every
instance of configs/conv/depthwise.yaml (f16 and bf16; 3x3 stride 1 and 2, 5x5, 7x7, 3x3 at a run-time stride and
dilation) on its default problems against the float64 reference (C = K = groups under, at and past a CTA's channel
block, H and W no multiples of the output tile, padding 0..3, asymmetric padding, alpha / beta, a 56 x 56 x 144
layer at batch 8 -- run twice more on its own: hundreds of CTAs, where CTAs walking several output tiles raced);
the planted bugs caught for their reason; the output against cuDNN (F.conv2d(groups=C) on channels_last tensors, in
the instance's dtype) with the workspace poisoned first (a CTA reading a filter element it did not reorder itself
reads NaN); and an exported library (these kernels beside a grouped implicit GEMM that also runs depthwise problems)
picking the direct kernel for a depthwise fprop (conv_select's kernel) and for the fprop of dy that the loader's
depthwise dgrad runs, with conv2d / conv2d_input_grad against torch, and a run-time stride whose shared memory
outgrows the first call's.

EMITTER_CONV_DW_GPU_DIR: a directory where configs/conv/depthwise.yaml was emitted and built; otherwise the test emits
and builds it. EMITTER_CONV_DW_LIBRARY: an exported and built library tree (name convdw) to use instead of building one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "configs" / "conv" / "depthwise.yaml"
pytestmark = pytest.mark.gpu
NAME = "convdw"
GROUPED = """\
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
"""


def _gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("needs an sm_80+ GPU visible to torch")
    return torch


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    _gpu()
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_DW_GPU_DIR")
    if root:
        root = Path(root)
    else:
        root = tmp_path_factory.mktemp("conv_dw_gpu") / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(SPEC), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    direct = [e for e in manifest["instances"] if e.get("config", {}).get("kernel") == "depthwise_direct"]
    assert len(direct) == 12, [e["name"] for e in direct]
    return {e["name"]: ConvKernel(root, e) for e in direct}


def test_every_direct_instance_passes_its_default_problems(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures, passed = [], 0
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 8, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 3000 + i)
            print(name, v["status"], v["problem"], f"rel_err={v.get('rel_err')}", v.get("reason", ""))
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
            else:
                passed += 1
    assert not failures, "\n".join(failures)
    assert passed >= 8 * len(kernels)


def test_every_direct_instance_passes_a_large_layer(kernels):
    """MobileNet's 56 x 56 x 144 layer at batch 8 (its verify problem; 392 CTAs a channel block, several on every SM):
    where the exported library's fprop had been wrong (relative error 5.8e-2) though every small problem passed -- a
    CTA then walked several output tiles and raced in CUTLASS's fused epilogue. Against the float64 reference."""
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures = []
    for name, k in kernels.items():
        big = [(p, d) for p, d in hooks.default_problems(k.cfg) if (p.n, p.h, p.w, p.c) == (8, 56, 56, 144)]
        assert len(big) == 1, name
        for seed in (11, 12):          # twice: a race need not show on every launch
            v = run_case(k, big[0][0], big[0][1], seed)
            print(name, v["status"], v["problem"], f"rel_err={v.get('rel_err')}", v.get("reason", ""))
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
    assert not failures, "\n".join(failures)


def test_planted_bugs_on_direct_instances_are_caught_for_their_reason(kernels):
    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    for name, k in kernels.items():
        p = planted_problem(k.cfg)
        assert run_case(k, p, "normal", 7)["status"] == "PASSED", name
        for bug in planted_bugs(k.cfg):
            v = run_case(k, p, "normal", 7, planted=bug)
            print(name, bug, v.get("status"), "misses", v.get("signature_misses"))
            assert expected_reason(bug, v), (name, bug, v.get("reason"), v.get("signature_misses"))


# benchmarks/conv_grouped_bench.py's depthwise layers at batch 4: (C, H, R, stride, padding)
LAYERS = [(144, 56, 3, 1, 1), (144, 56, 3, 2, 1), (384, 14, 3, 1, 1), (240, 28, 5, 1, 2), (96, 56, 7, 1, 3)]


def test_output_matches_cudnn_with_the_workspace_poisoned(kernels):
    import torch
    import torch.nn.functional as F

    from emitter.families.conv.problem import ConvProblem, not_supported_reasons

    torch.manual_seed(0)
    ran = set()
    for name, k in kernels.items():
        dt = torch.float16 if k.cfg.a.yaml == "f16" else torch.bfloat16     # (DType.value is a tuple)
        for c, h, r, st, pad in LAYERS:
            p = ConvProblem(n=4, h=h, w=h + 3, c=c, k=c, groups=c, r=r, s=r, pad_front=(0, pad, pad),
                            pad_back=(0, pad, pad), stride=(1, st, st))
            if not_supported_reasons(k.cfg.cfg, p):
                continue
            x = torch.randn(p.n, c, p.h, p.w, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
            w = torch.randn(c, 1, r, r, device="cuda", dtype=dt).contiguous()
            want = F.conv2d(x, w, stride=st, padding=pad, groups=c).float()        # cuDNN
            _, pp, qq = p.output_extents()
            y = torch.full((p.n, 1, pp, qq, c), float("nan"), device="cuda", dtype=dt)
            stream = torch.cuda.current_stream().cuda_stream
            ptrs = {"x": x.data_ptr(), "w": w.data_ptr(), "y": y.data_ptr()}
            packed, launch = k.prepare(p, ptrs, stream)
            assert launch.workspace_bytes >= c * r * r * x.element_size()
            k._workspace.fill_(0xFF)       # NaN in f16 and bf16: every filter element a CTA reads it must write first
            k.launch(packed, launch, stream)
            torch.cuda.synchronize()
            got = y[:, 0].permute(0, 3, 1, 2).float()
            rel = float((got - want).norm() / want.norm())
            print(name, (c, h, r, st, pad), f"rel vs cuDNN {rel:.2e}", "grid", list(launch.grid))
            assert torch.isfinite(got).all() and rel < (5e-3 if dt == torch.float16 else 2e-2), (name, rel)
            ran.add((r, st, k.cfg.a.yaml))
    assert {(3, 1, "f16"), (3, 2, "f16"), (5, 1, "f16"), (7, 1, "f16"), (3, 1, "bf16"), (7, 1, "bf16")} <= ran


# ------------------------------------------------------------------------------------------------ exported library
def _run(cmd, log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    assert r.returncode == 0, f"{cmd[:4]} failed; see {log}"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = _gpu()
    given = os.environ.get("EMITTER_CONV_DW_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("conv_dw_library_gpu")
        log = Path(os.environ.get("OUT", work)) / "conv_dw_library_build.log"
        grouped = work / "grouped.yaml"
        grouped.write_text("kernels:\n" + GROUPED)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", str(SPEC), str(grouped), "-o", str(work / "gen")], log)
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


def _close(got, want, what: str, tol: float) -> None:
    err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-12)).item()
    assert err < tol, f"{what}: relative error {err:.3e}"


@pytest.mark.nvcc
@pytest.mark.parametrize("case", LAYERS, ids=[f"c{c}_r{r}_s{st}" for c, _h, r, st, _p in LAYERS])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_library_picks_the_direct_kernel_for_depthwise_fprop_and_dgrad(lib, case, dtype):
    import torch
    import torch.nn.functional as F

    c, h, r, st, pad = case
    dt = torch.float16 if dtype == "f16" else torch.bfloat16
    tol = 5e-3 if dtype == "f16" else 2e-2
    x = torch.randn(2, c, h, h + 1, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
    w = torch.randn(c, 1, r, r, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
    sel = lib.conv_select("fprop", x, w, None, stride=st, padding=pad, groups=c)
    print(dtype, case, sel)
    assert "_dwdirect_" in sel["kernel"] and f"_f{r}x{r}_" in sel["kernel"] and f"_{dtype}_{dtype}_" in sel["kernel"], sel
    assert f"_st{st}x{st}_" in sel["kernel"] or "_stany_" in sel["kernel"], sel
    y = lib.conv2d(x, w, stride=st, padding=pad, groups=c)
    torch.cuda.synchronize()
    _close(y, F.conv2d(x, w, stride=st, padding=pad, groups=c), f"conv2d {dtype} {case}", tol)
    # the loader's depthwise dgrad: the depthwise fprop of dy (zero-inserted at stride > 1) with the filter rotated,
    # padding R - 1 - pad at stride 1: the direct kernel takes that fprop
    ys = F.conv2d(x.float(), w.float(), stride=st, padding=pad, groups=c)
    gy = torch.randn_like(ys).to(dt).contiguous(memory_format=torch.channels_last)
    if st == 1:
        rot = torch.flip(w, (2, 3)).contiguous(memory_format=torch.channels_last)
        route = lib.conv_select("fprop", gy, rot, None, stride=1, padding=r - 1 - pad, groups=c)
        assert "_dwdirect_" in route["kernel"], route
    xs = x.detach().float().requires_grad_()
    (gx,) = torch.autograd.grad(F.conv2d(xs, w.float(), stride=st, padding=pad, groups=c), (xs,),
                                grad_outputs=gy.float())
    _close(lib.conv2d_input_grad(gy, w, x.shape, stride=st, padding=pad, groups=c), gx, f"dgrad {dtype} {case}", tol)


@pytest.mark.nvcc
def test_library_falls_back_to_the_grouped_kernel_where_no_direct_kernel_fits(lib):
    import torch
    import torch.nn.functional as F

    x = torch.randn(2, 64, 12, 12, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(64, 1, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    sel = lib.conv_select("fprop", x, w, None, stride=1, padding=2, dilation=2, groups=64)  # only `any` is dilated
    assert "_stany_dlany_" in sel["kernel"], sel
    y = lib.conv2d(x, w, stride=1, padding=2, dilation=2, groups=64)
    torch.cuda.synchronize()
    _close(y, F.conv2d(x, w, stride=1, padding=2, dilation=2, groups=64), "run-time dilation", 5e-3)
    # then a larger window (stride 2 and dilation 2: 143360 bytes of shared memory against the 57344 above): the
    # library's > 48 KiB opt-in must cover it, not stay at the first call's bytes
    xb = torch.randn(2, 64, 40, 40, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    sel = lib.conv_select("fprop", xb, w, None, stride=2, padding=2, dilation=2, groups=64)
    assert "_stany_dlany_" in sel["kernel"], sel
    y = lib.conv2d(xb, w, stride=2, padding=2, dilation=2, groups=64)
    torch.cuda.synchronize()
    _close(y, F.conv2d(xb, w, stride=2, padding=2, dilation=2, groups=64), "run-time stride 2, dilation 2", 5e-3)
    w4 = torch.randn(64, 1, 4, 4, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    sel = lib.conv_select("fprop", x, w4, None, stride=1, padding=1, groups=64)  # a 4x4 filter: no direct kernel
    assert "_groupmultiple" in sel["kernel"], sel
    y = lib.conv2d(x, w4, stride=1, padding=1, groups=64)
    torch.cuda.synchronize()
    _close(y, F.conv2d(x, w4, stride=1, padding=1, groups=64), "grouped fallback", 5e-3)
