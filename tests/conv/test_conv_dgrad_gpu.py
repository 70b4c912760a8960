"""The dgrad kernels of issue 38 on the GPU: sm80 strided dgrad (CUTLASS 2.x's strided-dgrad kernel, 2D optimized and
analytic, 3D analytic; sm_80 builds that run on Hopper) and 1x1 stride-1 dgrad as a persistent sm90a GEMM
(`kernel: gemm_1x1`, cooperative / pingpong / stream-K), against the float64 reference: their default problems (odd
C/K/H/W, stride 2 and 3, strides differing by axis, a 1x1 filter at stride 2, padding per side, beta 0 and != 0,
small-integer data), ResNet-50's stride-2 and 1x1 layers at a small batch, the planted faults (each caught for its own
reason), the refusals (dilation on a strided dgrad, stride 2 on the GEMM) as SKIPPED, and an exported library that
dispatches stride-2 dgrad to the strided kernel, 1x1 dgrad to the GEMM and 3x3 stride-1 dgrad to sm90a's implicit
kernel, each against torch.

Kernels: $EMITTER_CONV_DGRAD_DIR (a directory where SPEC below was emitted and built), else the verify set's build
($EMITTER_CONV_GPU_DIR, scripts/gpu_suite.sh makes it; it holds every kind of SPEC), else SPEC is
emitted and built here. Library: $EMITTER_CONV_DGRAD_LIBRARY (an exported, built tree), else built here (CMake)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu

SPEC = """
kernels:
  - family: conv
    arch: sm80
    op: dgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
    stride_support: strided
  - family: conv
    arch: sm80
    op: dgrad
    dtype: {a: bf16, c: bf16, accumulator: f32, epilogue: f32}
    tile: 64x64x64
    warp: 32x32x64
    stages: 3
    iterator: analytic
    alignment: {a: 4, b: 4, c: 8}
    stride_support: strided
    swizzle: 4
  - family: conv
    arch: sm80
    op: dgrad
    dims: 3
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x64x32
    warp: 64x32x32
    stages: 4
    iterator: analytic
    stride_support: strided
  - family: conv
    arch: sm90a
    op: dgrad
    kernel: gemm_1x1
    dtype: [{a: f16, c: f16, accumulator: f32, epilogue: f32}, {a: bf16, c: bf16, accumulator: f32, epilogue: f32}]
    tile: 128x128x64
    schedule: [cooperative, pingpong]
    exclude:
      - {dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}, schedule: pingpong}
      - {dtype: {a: bf16, c: bf16, accumulator: f32, epilogue: f32}, schedule: cooperative}
  - family: conv
    arch: sm90a
    op: dgrad
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    scheduler: stream_k
"""


def _new_dgrad(name: str) -> bool:
    return "dgrad" in name and ("_strided_" in name or "gemm1x1" in name)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_DGRAD_DIR") or os.environ.get("EMITTER_CONV_GPU_DIR")
    if root:
        root = Path(root)
    else:
        tmp = tmp_path_factory.mktemp("conv_dgrad_gpu")
        (tmp / "spec.yaml").write_text(SPEC)
        root = tmp / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    hopper = torch.cuda.get_device_capability(0) == (9, 0)
    out = {}
    for e in json.loads((root / "manifest.json").read_text())["instances"]:
        if _new_dgrad(e["name"]) and (hopper or e["arch"] != "sm90a"):
            out[e["name"]] = ConvKernel(root, e)      # a build failure fails here, loudly
    assert any("_strided_" in n for n in out), f"no strided dgrad instance in {root}"
    return out


def test_default_problems_pass(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures, passed, strides = [], 0, set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 5, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 3000 + i)
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
            else:
                passed += 1
                strides.add(p.stride[1:])
    assert not failures, "\n".join(failures)
    assert passed >= 5 * len(kernels)
    assert {(1, 1), (2, 2), (3, 3), (2, 3)} <= strides


# ResNet-50's stride-2 dgrad layers at N = 2: (C, H=W, K, R=S, pad); the 1x1 s2 shortcuts leave 3 of 4 dx phases
# without a tap (dx = beta * source there)
STRIDED = [(128, 56, 128, 3, 1), (256, 28, 256, 3, 1), (256, 56, 512, 1, 0), (1024, 14, 2048, 1, 0)]
ONE_BY_ONE = [(256, 56, 64), (64, 56, 256), (1024, 14, 256)]


@pytest.mark.parametrize("layer", STRIDED)
def test_resnet_stride_2_layers(kernels, layer):
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import run_case

    c, hw, k, rs, pad = layer
    ran = 0
    for name, kern in kernels.items():
        if "_strided_" not in name or kern.cfg.dims != 2:
            continue
        p = ConvProblem(n=2, h=hw, w=hw, c=c, k=k, r=rs, s=rs, pad_front=(0, pad, pad), pad_back=(0, pad, pad),
                        stride=(1, 2, 2), beta=0.5)
        v = run_case(kern, p, "normal", 13)
        assert v["status"] == "PASSED", (name, v.get("problem"), v.get("reason"), v.get("rel_err"))
        ran += 1
    assert ran


@pytest.mark.parametrize("layer", ONE_BY_ONE)
def test_resnet_1x1_layers_on_the_gemm(kernels, layer):
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import run_case

    c, hw, k = layer
    gemms = {n: kern for n, kern in kernels.items() if "gemm1x1" in n}
    if not gemms:
        pytest.skip("the gemm_1x1 dgrad kernels are sm90a: not on this GPU")
    for name, kern in gemms.items():
        p = ConvProblem(n=4, h=hw, w=hw, c=c, k=k, r=1, s=1, beta=0.5)
        v = run_case(kern, p, "normal", 17)
        assert v["status"] == "PASSED", (name, v.get("problem"), v.get("reason"), v.get("rel_err"))


def test_planted_faults_are_caught_for_their_reason(kernels):
    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    seen = set()
    for name, kern in kernels.items():
        if kern.cfg.dims != 2:
            continue
        p = planted_problem(kern.cfg)
        clean = run_case(kern, p, "normal", 7)
        assert clean["status"] == "PASSED", (name, clean.get("reason"))
        for bug in planted_bugs(kern.cfg):
            v = run_case(kern, p, "normal", 7, planted=bug)
            print(name, bug, v.get("status"), "bad rows", v.get("bad_rows"), "cols", v.get("bad_cols"),
                  "unwritten rows", v.get("unwritten_rows"), "model", (v.get("fault_model") or {}).get("status"))
            assert expected_reason(bug, v), (name, bug, v.get("status"), v.get("reason"), v.get("signature_misses"))
            seen.add((bug, "gemm1x1" in name))
    assert {("wrong_padding", False), ("swapped_filter_axes", False), ("stride_ignored", False),
            ("row_short", False)} <= seen


def test_refusals_are_skipped_not_crashes(kernels):
    from emitter.families.conv.problem import ConvProblem, not_supported_reasons
    from emitter.families.conv.runner import run_case

    for name, kern in kernels.items():
        if kern.cfg.dims != 2:
            continue
        if "_strided_" in name:
            bad = ConvProblem(n=2, h=12, w=12, c=64, k=64, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2),
                              stride=(1, 2, 2), dilation=(1, 2, 2))
        else:
            bad = ConvProblem(n=2, h=13, w=11, c=64, k=64, r=1, s=1, stride=(1, 2, 2))
        assert not_supported_reasons(kern.cfg.cfg, bad), name
        v = run_case(kern, bad, "normal", 3)
        assert v["status"] == "SKIPPED" and "EMITTER_CANNOT_IMPLEMENT" in v["reason"], (name, v)


def test_stream_k_gemm_relaunch_on_one_initialize(kernels):
    """Initialized once, launched again and again (as the profile and the bench do): every launch right."""
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import to_device, to_host

    streamk = [k for n, k in kernels.items() if "gemm1x1_coop_streamk" in n]
    if not streamk:
        pytest.skip("no stream-K gemm_1x1 dgrad in this build (SPEC and the verify set hold one)")
    for kern in streamk:
        torch = kern.torch
        p = ConvProblem(n=2, h=9, w=7, c=64, k=1024, r=1, s=1, beta=1.0)     # one tile row, K-dim 1024: split
        inputs = hooks.make_inputs(kern.cfg, p, "normal", 5)
        dts = {"y": kern.cfg.a, "w": kern.cfg.a, "x": kern.cfg.c, "source": kern.cfg.c}
        dev = {t: to_device(torch, v, dts[t]) for t, v in inputs.buffers.items() if v is not None and t in dts}
        poisoned = dev["x"].clone()
        stream = torch.cuda.current_stream().cuda_stream
        packed, launch = kern.prepare(p, {t: v.data_ptr() for t, v in dev.items()}, stream)
        ref = hooks.reference(kern.cfg, p, inputs, "cuda")
        for i in range(4):
            dev["x"].copy_(poisoned)
            kern.launch(packed, launch, stream)
            torch.cuda.synchronize()
            verdict = hooks.compare(kern.cfg, p, inputs, {"x": to_host(torch, dev["x"], kern.cfg.c)}, ref)
            assert verdict["status"] == "PASSED", (kern.name, i, verdict.get("reason"))


# ------------------------------------------------------------------------------------------------ the library
LIB_SPEC_TAIL = """\
  - family: conv
    arch: sm90a
    op: dgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
  - family: conv
    arch: sm90a
    op: dgrad
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x256x64
  - family: conv
    arch: sm80
    op: dgrad
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    warp: 64x64x64
    stages: 3
    stride_support: strided
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """An exported library (one GEMM kernel per arch, which a library needs; sm90a implicit dgrad, the 1x1 dgrad GEMM,
    sm80 strided dgrad), CMake-built (a few minutes on 16 cores); $EMITTER_CONV_DGRAD_LIBRARY: a built tree."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _helpers import GEMM_SPEC_NO_SWIZZLE, load_module

    name = "convdgrad"
    given = os.environ.get("EMITTER_CONV_DGRAD_LIBRARY")
    if given:
        tree = Path(given)
    else:
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        work = tmp_path_factory.mktemp("conv_dgrad_lib")
        (work / "spec.yaml").write_text(GEMM_SPEC_NO_SWIZZLE + LIB_SPEC_TAIL)
        py, jobs = sys.executable, os.environ.get("EMITTER_TEST_JOBS", str(os.cpu_count() or 4))
        tree = work / name
        for cmd in ([py, "-m", "emitter", "emit", str(work / "spec.yaml"), "-o", str(work / "gen")],
                    [py, "-m", "emitter", "library", str(work / "gen"), "--name", name, "-o", str(tree)],
                    ["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_CUDA_ARCHITECTURES=80;90;90a",
                     "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", str(tree / "build"), "-j", jobs]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, (cmd[:4], r.stdout[-3000:], r.stderr[-3000:])
    so = next(iter(sorted(tree.rglob(f"lib{name}.so"))))
    mod = load_module(name, tree / "python" / f"{name}.py")
    mod.load(str(so))
    return mod


@pytest.mark.nvcc
def test_library_dispatches_strided_and_1x1_dgrad(lib):
    import torch

    def cl(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def close(got, want, what):
        err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
        assert err < 1e-2, f"{what}: max relative error {err:.3e}"

    cases = [  # (N, C, H, W, K, R, S, stride, padding, the kernel dispatch must pick)
        (3, 64, 15, 13, 72, 3, 3, 2, 1, "_strided_"),      # stride 2: the sm90a dgrad refuses, sm80 strided runs it
        (2, 64, 17, 16, 64, 3, 3, 3, 1, "_strided_"),      # stride 3
        (4, 256, 14, 14, 512, 1, 1, 2, 0, "_strided_"),    # a 1x1 s2 shortcut
        (3, 64, 15, 13, 72, 1, 1, 1, 0, "gemm1x1"),        # 1x1 stride 1: the GEMM (its larger tile goes first)
        (3, 64, 15, 13, 72, 3, 3, 1, 1, "sm90a"),          # 3x3 stride 1: sm90a's implicit dgrad (the GEMM refuses)
    ]
    for n, c, h, w, k, r, s, stride, pad, want_kernel in cases:
        wt = cl(k, c, r, s)
        out_h, out_w = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
        gy = cl(n, k, out_h, out_w)
        sel = lib.conv_select("dgrad", None, wt, gy, stride=stride, padding=pad, shape=(n, c, h, w))
        assert want_kernel in sel["kernel"] and (want_kernel != "sm90a" or "gemm1x1" not in sel["kernel"]), sel
        want = torch.nn.grad.conv2d_input((n, c, h, w), wt.double(), gy.double(), stride=stride, padding=pad)
        close(lib.conv2d_input_grad(gy, wt, (n, c, h, w), stride=stride, padding=pad), want,
              f"conv2d_input_grad {(n, c, h, w, k, r, s)} stride {stride}")
    # dilation on a strided problem: no kernel runs it, a clear refusal (not a crash)
    wt, gy = cl(64, 64, 3, 3), cl(2, 64, 6, 6)          # (12 + 2 * 2 - 2 * 2 - 1) // 2 + 1 = 6
    with pytest.raises(lib.Error) as e:
        lib.conv2d_input_grad(gy, wt, (2, 64, 12, 12), stride=2, padding=2, dilation=2)
    assert e.value.status == 1
    torch.cuda.synchronize()
