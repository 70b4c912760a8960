"""sm90a strided dgrad on the GPU (issue 38): emitter's stride-phase kernel (CUTLASS's unit-stride sm90 dgrad once a
stride phase, the phases as z-slices of one launch, a zero-tap slice writing beta * source), f16 and bf16, against
the float64 reference: the default problems (odd C/K/H/W with C, K multiples of 8 but not of 64, stride 2 and 3 and
2x3, 1x1 / 2x2 / 3x3 / 5x5, padding per side, beta 0 and != 0), extra odd layers (5x5 stride 2, 1x1 stride 3,
stride 1 through the same instance), ResNet's stride-2 layers at a small batch, the planted faults, the refusals
(dilation with stride, more phases than a launch holds) as SKIPPED, and one speed line: ResNet's stride-2 3x3 C128
56^2 at N = 64 against aten.convolution_backward on channels_last tensors (cuDNN).

Kernels: $EMITTER_CONV_STRIDED_DIR (a directory where SPEC below was emitted and built), else emitted and built here
(two sm90a instances, about 2 minutes of nvcc on 16 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SPEC = """
kernels:
  - family: conv
    arch: sm90a
    op: dgrad
    dims: 2
    dtype: [{a: f16, c: f16, accumulator: f32, epilogue: f32}, {a: bf16, c: bf16, accumulator: f32, epilogue: f32}]
    tile: 128x128x64
    cluster: 1x1x1
    stride_support: strided
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("sm90a kernels need a Hopper GPU")
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_STRIDED_DIR")
    if root:
        root = Path(root)
    else:
        tmp = tmp_path_factory.mktemp("conv_strided_gpu")
        (tmp / "spec.yaml").write_text(SPEC)
        root = tmp / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(tmp / "spec.yaml"), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    out = {}
    for e in json.loads((root / "manifest.json").read_text())["instances"]:
        if e["arch"] == "sm90a" and "dgrad" in e["name"] and "_strided_" in e["name"]:
            out[e["name"]] = ConvKernel(root, e)      # a build failure fails here, loudly
    assert len(out) >= 2, f"the f16 and bf16 strided sm90a dgrad instances are not in {root}"
    return out


def _check(kern, p, seed: int, data: str = "normal") -> dict:
    from emitter.families.conv.runner import run_case

    v = run_case(kern, p, data, seed)
    assert v["status"] == "PASSED", (kern.name, v.get("problem"), v.get("reason"), v.get("rel_err"))
    return v


def test_default_problems_pass(kernels):
    from emitter.families.conv import runtime as hooks

    strides = set()
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 8, name
        for i, (p, data) in enumerate(cases):
            _check(k, p, 4000 + i, data)
            strides.add(p.stride[1:])
    assert {(1, 1), (2, 2), (3, 3), (2, 3)} <= strides


def test_odd_layers(kernels):
    from emitter.families.conv.problem import ConvProblem

    layers = [
        ConvProblem(n=3, h=19, w=17, c=24, k=40, r=5, s=5, pad_front=(0, 2, 1), pad_back=(0, 1, 2), stride=(1, 2, 2),
                    beta=0.5, alpha=1.25),
        ConvProblem(n=2, h=23, w=22, c=72, k=56, r=1, s=1, stride=(1, 3, 3), beta=-1.0),    # 8 of 9 phases tapless
        ConvProblem(n=2, h=6, w=7, c=16, k=24, r=3, s=3, stride=(1, 2, 2), beta=0.25),       # rows past dy's end
        ConvProblem(n=4, h=15, w=13, c=136, k=8, r=3, s=3, pad_front=(0, 1, 0), pad_back=(0, 0, 1), stride=(1, 3, 2)),
        ConvProblem(n=2, h=14, w=14, c=40, k=72, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),   # stride 1
    ]
    for kern in kernels.values():
        for i, p in enumerate(layers):
            _check(kern, p, 50 + i)


@pytest.mark.parametrize("layer", [(128, 56, 128, 3, 1), (256, 28, 256, 3, 1), (256, 56, 512, 1, 0),
                                   (1024, 14, 2048, 1, 0)])
def test_resnet_stride_2_layers(kernels, layer):
    from emitter.families.conv.problem import ConvProblem

    c, hw, k, rs, pad = layer
    for kern in kernels.values():
        p = ConvProblem(n=2, h=hw, w=hw, c=c, k=k, r=rs, s=rs, pad_front=(0, pad, pad), pad_back=(0, pad, pad),
                        stride=(1, 2, 2), beta=0.5)
        _check(kern, p, 13)


def test_planted_faults_are_caught_for_their_reason(kernels):
    from emitter.families.conv.runner import expected_reason, planted_bugs, planted_problem, run_case

    for name, kern in kernels.items():
        p = planted_problem(kern.cfg)
        assert max(p.stride) == 2
        clean = run_case(kern, p, "normal", 7)
        assert clean["status"] == "PASSED", (name, clean.get("reason"))
        bugs = planted_bugs(kern.cfg)
        assert "stride_ignored" in bugs and "row_short" in bugs
        for bug in bugs:
            v = run_case(kern, p, "normal", 7, planted=bug)
            assert expected_reason(bug, v), (name, bug, v.get("status"), v.get("reason"), v.get("signature_misses"))


def test_refusals_are_skipped_not_crashes(kernels):
    from emitter.families.conv.problem import ConvProblem
    from emitter.families.conv.runner import run_case

    kern = next(iter(kernels.values()))
    for p in (ConvProblem(n=2, h=13, w=11, c=40, k=72, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2),
                          stride=(1, 2, 2), dilation=(1, 2, 2)),
              ConvProblem(n=2, h=13, w=11, c=40, k=72, r=3, s=3, stride=(1, 4, 3))):
        v = run_case(kern, p, "normal", 1)
        assert v["status"] == "SKIPPED", (p, v.get("status"), v.get("reason"))


def test_speed_resnet_stride_2_3x3_c128_against_cudnn(kernels):
    """Prints one line: emitter's f16 kernel and cuDNN (aten.convolution_backward, channels_last, benchmark mode)
    on ResNet's stride-2 3x3 C128 56^2 layer at N = 64, median of CUDA-event batches; asserts only that both ran and
    emitter's result matches cuDNN's."""
    import torch

    from emitter.families.conv.baseline import torch_conv
    from emitter.families.conv.problem import ConvProblem

    kern = next(k for n, k in kernels.items() if "_f16_f16_" in n)
    n, c, hw, k = 64, 128, 56, 128
    p = ConvProblem(n=n, h=hw, w=hw, c=c, k=k, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2))
    P = p.output_extents()[1]
    torch.backends.cudnn.benchmark = True
    g = torch.Generator(device="cuda").manual_seed(0)
    cl = torch.channels_last
    x = torch.empty(n, c, hw, hw, device="cuda", dtype=torch.float16).to(memory_format=cl)
    w = (torch.randn(k, c, 3, 3, device="cuda", generator=g) * 0.05).half().to(memory_format=cl)
    dy = torch.randn(n, k, P, P, device="cuda", generator=g).half().to(memory_format=cl)
    dx = torch.empty_like(x)
    # NHWC storage == channels_last NCHW memory: (N,1,H,W,C) views for emitter's kernel
    tensors = {"x": dx.permute(0, 2, 3, 1).unsqueeze(1), "w": w.permute(0, 2, 3, 1).unsqueeze(1),
               "y": dy.permute(0, 2, 3, 1).unsqueeze(1), "source": None, "bias": None}
    stream = torch.cuda.current_stream().cuda_stream
    ptrs = {kk: (v.data_ptr() if v is not None else 0) for kk, v in tensors.items()}
    packed, launch = kern.prepare(p, ptrs, stream)

    def ours():
        kern.launch(packed, launch, stream)

    def cudnn():
        return torch_conv(torch, "dgrad", x, w, dy, stride=2, padding=1)

    def median_ms(fn, calls: int = 20, reps: int = 7) -> float:
        for _ in range(5):
            fn()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / calls)
        return sorted(times)[len(times) // 2]

    t_ours, t_cudnn = median_ms(ours), median_ms(cudnn)
    ref = cudnn().float()
    ours()
    torch.cuda.synchronize()
    err = ((dx.float() - ref).abs().max() / ref.abs().max()).item()
    flops = 2.0 * n * P * P * k * c * 9
    print(f"\nSPEED sm90a strided dgrad f16 3x3 s2 C128 K128 56^2 N64: emitter {t_ours * 1e3:.1f} us "
          f"({flops / t_ours / 1e9:.0f} TFLOP/s), cuDNN {t_cudnn * 1e3:.1f} us ({flops / t_cudnn / 1e9:.0f} TFLOP/s), "
          f"{t_cudnn / t_ours:.2f}x cuDNN; launch {launch.as_dict()}")
    assert err < 2e-2, err
