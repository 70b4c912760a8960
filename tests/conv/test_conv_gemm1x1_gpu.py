"""Conv `kernel: gemm_1x1` on the GPU (issue 28's 1x1 layers): sm90a 1x1 fprop (cooperative / pingpong, fused bias +
ReLU) and wgrad (stream-K) as persistent CUTLASS 3.x GEMMs, built and checked against the float64 reference on
their default problems (odd N*P*Q, C and K not tile multiples, beta 0 and != 0) and ResNet-50's 1x1 layers at a
small batch; a 3x3 / strided / padded problem refused by the shim (EMITTER_CANNOT_IMPLEMENT, SKIPPED, no crash);
a stream-K instance launched again and again on ONE initialize (its tile locks reset in the kernel) stays right.

Set EMITTER_CONV_GEMM1X1_DIR to a directory where `emitter emit tests/... (SPEC below) -o DIR && emitter build DIR`
ran; otherwise the test emits and builds the spec below (5 instances, about a minute each)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: fprop
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    epilogue: {activation: relu, bias: true}
  - family: conv
    arch: sm90a
    op: fprop
    kernel: gemm_1x1
    dtype: {a: bf16, c: bf16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    schedule: pingpong
  - family: conv
    arch: sm90a
    op: wgrad
    kernel: gemm_1x1
    dtype: [{a: f16, c: f16, accumulator: f32, epilogue: f32}, {a: bf16, c: bf16, accumulator: f32, epilogue: f32}]
    tile: 128x128x64
    scheduler: stream_k
  - family: conv
    arch: sm90a
    op: wgrad
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x64x64
    swap_ab: true
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_GEMM1X1_DIR")
    if root:
        root = Path(root)
    else:
        tmp = tmp_path_factory.mktemp("conv_gemm1x1_gpu")
        (tmp / "spec.yaml").write_text(SPEC)
        root = tmp / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    out = {}
    for e in manifest["instances"]:
        if e["config"].get("kernel") == "gemm_1x1":
            out[e["name"]] = ConvKernel(root, e)      # a build failure fails here, loudly
    assert out, f"no gemm_1x1 instance in {root}"
    return out


def test_default_problems_pass(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures, passed, ops = [], 0, set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 5, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 2000 + i)
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
            else:
                passed += 1
                ops.add(k.cfg.op)
    assert not failures, "\n".join(failures)
    assert ops == {"fprop", "wgrad"} and passed >= 5 * len(kernels)


# ResNet-50's 1x1 layers (issue 28's table) at N = 4: (C, H=W, K)
LAYERS = [(256, 56, 64), (64, 56, 256), (1024, 14, 256)]


@pytest.mark.parametrize("layer", LAYERS)
def test_resnet_1x1_layers(kernels, layer):
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import run_case

    c, hw, k = layer
    for name, kern in kernels.items():
        p = ConvProblem(n=4, h=hw, w=hw, c=c, k=k, r=1, s=1, beta=0.5, bias=kern.cfg.bias)
        v = run_case(kern, p, "normal", 11)
        assert v["status"] == "PASSED", (name, v.get("problem"), v.get("reason"), v.get("rel_err"))


def test_non_gemm_problems_are_refused_cleanly(kernels):
    from emitter.families.conv.abi import c_problem_from
    from emitter.families.conv.problem import ConvProblem, not_supported_reasons
    from emitter.families.conv.runner import run_case
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_OK

    ptrs = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22, "bias": 1 << 23}
    for name, kern in kernels.items():
        bias = kern.cfg.bias
        ok = ConvProblem(n=2, h=9, w=9, c=64, k=64, r=1, s=1, bias=bias)
        use = ptrs if bias else {t: v for t, v in ptrs.items() if t != "bias"}
        assert kern.shim.query(c_problem_from(ok, use))[0] == EMITTER_OK, name
        three = replace(ok, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
        for p in (three, replace(ok, stride=(1, 2, 2)), replace(ok, r=3, s=3)):
            assert kern.shim.query(c_problem_from(p, use))[0] == EMITTER_CANNOT_IMPLEMENT, (name, p.label())
            assert not_supported_reasons(kern.cfg.cfg, p), (name, p.label())   # the host-side mirror agrees
        v = run_case(kern, three, "normal", 3)        # through the runner: SKIPPED, no launch, no crash
        assert v["status"] == "SKIPPED" and "EMITTER_CANNOT_IMPLEMENT" in v["reason"], v


def test_stream_k_relaunch_on_one_initialize(kernels):
    """The profile and the bench initialize once and launch many times: the stream-K tile locks must be back at
    zero after every launch (emitter's resetting scheduler), or later launches would read partial sums early."""
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import to_device, to_host
    from emitter.dtypes import DType

    streamk = [k for n, k in kernels.items() if "_streamk" in n]
    assert streamk
    for kern in streamk:
        torch = kern.torch
        p = ConvProblem(n=8, h=28, w=27, c=64, k=64, r=1, s=1, beta=1.0)    # 4 output tiles, K-dim 6048: split
        inputs = hooks.make_inputs(kern.cfg, p, "normal", 5)
        dts = {"x": kern.cfg.a, "y": kern.cfg.a, "w": kern.cfg.c, "source": kern.cfg.c}
        dev = {t: to_device(torch, v, dts[t]) for t, v in inputs.buffers.items() if v is not None and t in dts}
        poisoned = dev["w"].clone()
        stream = torch.cuda.current_stream().cuda_stream
        packed, launch = kern.prepare(p, {t: v.data_ptr() for t, v in dev.items()}, stream)
        ref = hooks.reference(kern.cfg, p, inputs, "cuda")
        for i in range(4):
            dev["w"].copy_(poisoned)
            kern.launch(packed, launch, stream)
            torch.cuda.synchronize()
            got = to_host(torch, dev["w"], kern.cfg.c)
            verdict = hooks.compare(kern.cfg, p, inputs, {"w": got}, ref)
            assert verdict["status"] == "PASSED", (kern.name, i, verdict.get("reason"))
        assert min(tuple(launch.grid)) >= 1 and kern.cfg.a in (DType.f16, DType.bf16)


def test_planted_short_output_is_caught(kernels):
    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    for name, kern in kernels.items():
        p = planted_problem(kern.cfg)
        assert (p.r, p.s) == (1, 1) and planted_bugs(kern.cfg) == ("row_short",)
        clean = run_case(kern, p, "normal", 7)
        assert clean["status"] == "PASSED", (name, clean.get("reason"))
        v = run_case(kern, p, "normal", 7, planted="row_short")
        assert expected_reason("row_short", v), (name, v.get("status"), v.get("unwritten"), v.get("reason"))


# ------------------------------------------------------------------------------------------------ the library
LIB_SPEC_TAIL = """\
  - family: conv
    arch: sm90a
    op: [fprop, wgrad]
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
  - family: conv
    arch: sm90a
    op: [fprop, wgrad]
    kernel: gemm_1x1
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """An exported library (one GEMM kernel per arch, which a library needs; sm90a implicit fprop / wgrad and
    gemm_1x1 fprop / wgrad), CMake-built (a few minutes on 16 cores); $EMITTER_CONV_GEMM1X1_LIBRARY: a built tree."""
    import shutil

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _helpers import GEMM_SPEC_NO_SWIZZLE, load_module

    name = "convg1x1"
    given = os.environ.get("EMITTER_CONV_GEMM1X1_LIBRARY")
    if given:
        tree = Path(given)
    else:
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        work = tmp_path_factory.mktemp("conv_gemm1x1_lib")
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
def test_library_dispatch_uses_gemm_1x1_and_falls_through(lib):
    import torch
    import torch.nn.functional as F

    def cl(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)

    def close(got, want, what):
        err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
        assert err < 1e-2, f"{what}: max relative error {err:.3e}"

    x, w1, w3 = cl(3, 64, 15, 13), cl(72, 64, 1, 1), cl(72, 64, 3, 3)
    # 1x1: the gemm_1x1 kernels are chosen (unity-stride first at stride 1) and right
    sel = lib.conv_select("fprop", x, w1, None)
    assert "gemm1x1" in sel["kernel"], sel
    close(lib.conv2d(x, w1), F.conv2d(x.double(), w1.double()), "conv2d 1x1")
    gy = cl(3, 72, 15, 13)
    sel = lib.conv_select("wgrad", x, None, gy, shape=(72, 64, 1, 1))
    assert "gemm1x1" in sel["kernel"], sel
    want_dw = torch.nn.grad.conv2d_weight(x.double(), (72, 64, 1, 1), gy.double())
    for _ in range(3):      # stream-K workspace: every call right
        close(lib.conv2d_weight_grad(x, gy, (72, 64, 1, 1)), want_dw, "conv2d_weight_grad 1x1")
    # 3x3 / stride 2: gemm_1x1 refuses, dispatch falls through to the implicit kernels
    sel = lib.conv_select("fprop", x, w3, None, padding=1)
    assert "gemm1x1" not in sel["kernel"], sel
    close(lib.conv2d(x, w3, padding=1), F.conv2d(x.double(), w3.double(), padding=1), "conv2d 3x3")
    close(lib.conv2d(x, w1, stride=2), F.conv2d(x.double(), w1.double(), stride=2), "conv2d 1x1 stride 2")
    # forced onto a 3x3 problem: a clear can-implement refusal, no crash
    g1x1 = [n for n in lib.conv_kernels() if "gemm1x1" in n and "fprop" in n]
    with pytest.raises(lib.Error) as e:
        lib.conv2d(x, w3, padding=1, kernel=g1x1[0])
    assert e.value.status == 1
    torch.cuda.synchronize()
