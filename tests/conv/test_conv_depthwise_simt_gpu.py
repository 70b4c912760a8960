"""emitter's SIMT depthwise kernel (`kernel: depthwise_simt`, sm80; Hopper runs the sm_80 build) on the GPU: every
instance of configs/conv/depthwise_simt.yaml and depthwise_simt_dgrad.yaml (wgrad, fprop, dgrad; 3x3, 5x5, 7x7; f16
and bf16) on its default problems
against the float64 reference (C below, at and past a CTA's channel block, no multiple of 64; odd H and W; stride 1
and 2; dilation 2; asymmetric padding; alpha and beta != 0; a layer whose wgrad reduction runs both levels), the
planted bugs caught for their reason, the wgrad run twice on one workspace (its tickets must come back zero, and the
result must be bit-identical: the reduction is deterministic), and a speed table against cuDNN on MobileNetV2 /
EfficientNet / ConvNeXt depthwise layers (F.conv2d(groups=C) for fprop, aten.convolution_backward on channels_last
tensors for wgrad), each output checked against cuDNN's; and the exported library of the config (CMake, sm_80)
choosing these kernels for depthwise wgrad and fprop, its conv2d_weight_grad / conv2d / conv2d_input_grad against
torch.

EMITTER_CONV_DWSIMT_GPU_DIR: a directory where both configs were emitted and built; otherwise the test emits and builds
them (18 instances, about 7 s of nvcc each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "configs" / "conv" / "depthwise_simt.yaml"
DGRAD = ROOT / "configs" / "conv" / "depthwise_simt_dgrad.yaml"
pytestmark = pytest.mark.gpu


def _gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("needs an sm_80+ GPU visible to torch")
    return torch


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    _gpu()
    from emitter.families.conv.runner import ConvKernel

    root = os.environ.get("EMITTER_CONV_DWSIMT_GPU_DIR")
    if root:
        root = Path(root)
    else:
        root = tmp_path_factory.mktemp("conv_dwsimt_gpu") / "gen"
        run = [sys.executable, "-m", "emitter"]
        subprocess.run(run + ["emit", str(SPEC), str(DGRAD), "-o", str(root)], check=True)
        subprocess.run(run + ["build", str(root), "-j", str(os.cpu_count() or 4), "--no-progress"], check=False)
    manifest = json.loads((root / "manifest.json").read_text())
    simt = [e for e in manifest["instances"] if e.get("config", {}).get("kernel") == "depthwise_simt"]
    assert len(simt) == 18, [e["name"] for e in simt]
    return {e["name"]: ConvKernel(root, e) for e in simt}


def test_every_instance_passes_its_default_problems(kernels):
    from emitter.families.conv import runtime as hooks
    from emitter.families.conv.runner import run_case

    failures, passed = [], 0
    for name, k in kernels.items():
        cases = hooks.default_problems(k.cfg)
        assert len(cases) >= 8, name
        for i, (p, data) in enumerate(cases):
            v = run_case(k, p, data, 4000 + i)
            print(name, v["status"], v["problem"], f"rel_err={v.get('rel_err')}", v.get("reason", ""))
            if v["status"] != "PASSED":
                failures.append(f"{name} {v['problem']}: {v['status']} {v.get('reason')}")
            else:
                passed += 1
    assert not failures, "\n".join(failures)
    assert passed >= 8 * len(kernels)


def test_planted_bugs_are_caught_for_their_reason(kernels):
    from emitter.families.conv.runner import _wgrad_swapped, expected_reason, planted_bugs, planted_problem, run_case

    for name, k in kernels.items():
        if "_f16_" not in name:          # the bf16 twins run the same code
            continue
        p = planted_problem(k.cfg)
        assert run_case(k, p, "normal", 7)["status"] == "PASSED", name
        bugs = planted_bugs(k.cfg)
        want = {"wrong_padding", "swapped_filter_axes", "stride_ignored", "row_short", "group_offset"}
        assert set(bugs) == (want - {"group_offset"} if k.cfg.op == "dgrad" else want)
        for bug in bugs:
            if bug == "swapped_filter_axes" and k.cfg.op == "wgrad":
                v = _wgrad_swapped(k, p, 7)
            else:
                v = run_case(k, p, "normal", 7, planted=bug)
            print(name, bug, v.get("status"), "misses", v.get("signature_misses"))
            assert expected_reason(bug, v), (name, bug, v.get("reason"), v.get("signature_misses"))


# (label, N, C, H, R, stride): MobileNetV2 / EfficientNet-B0 / ConvNeXt-T depthwise layers
LAYERS = [
    ("MobileNetV2 C96 112^2 3x3 s2", 32, 96, 112, 3, 2),
    ("MobileNetV2 C144 56^2 3x3", 32, 144, 56, 3, 1),
    ("MobileNetV2 C144 56^2 3x3 s2", 32, 144, 56, 3, 2),
    ("MobileNetV2 C384 14^2 3x3", 64, 384, 14, 3, 1),
    ("MobileNetV2 C960 7^2 3x3", 64, 960, 7, 3, 1),
    ("EfficientNet-B0 C240 28^2 5x5", 32, 240, 28, 5, 1),
    ("EfficientNet-B0 C480 14^2 5x5", 64, 480, 14, 5, 1),
    ("ConvNeXt-T C96 56^2 7x7", 32, 96, 56, 7, 1),
]


def _time(torch, fn, reps: int = 20) -> float:
    """Median seconds of fn over reps launches (CUDA events), after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return sorted(times)[len(times) // 2]


def _kernel_for(kernels, op: str, r: int, dt: str):
    (k,) = [k for k in kernels.values() if k.cfg.op == op and tuple(k.cfg.filter) == (r, r) and k.cfg.a.yaml == dt]
    return k


def test_wgrad_is_deterministic_and_leaves_its_tickets_zero(kernels):
    """Two launches on one workspace (the tickets zeroed once, by initialize) give bit-identical dw, and the tickets
    are zero afterwards; a layer of many slices (both reduction levels)."""
    torch = _gpu()
    from emitter.families.conv.problem import ConvProblem

    k = _kernel_for(kernels, "wgrad", 3, "f16")
    c, n, h = 136, 16, 40
    p = ConvProblem(n=n, h=h, w=h, c=c, k=c, groups=c, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    dy = torch.randn(n, c, h, h, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    dw = torch.full((c, 1, 3, 3), float("nan"), device="cuda", dtype=torch.float16)
    stream = torch.cuda.current_stream().cuda_stream
    packed, launch = k.prepare(p, {"x": x.data_ptr(), "y": dy.data_ptr(), "w": dw.data_ptr()}, stream)
    assert launch.grid[1] > 16, list(launch.grid)            # more than one group of slices: both levels
    k.launch(packed, launch, stream)
    first = dw.clone()
    k.launch(packed, launch, stream)
    torch.cuda.synchronize()
    assert torch.equal(first, dw)
    want = torch.ops.aten.convolution_backward(dy, x, torch.empty_like(dw), None, [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], c, [False, True, False])[1]
    rel = float((dw.float() - want.float()).norm() / want.float().norm())
    assert rel < 5e-3, rel
    ws = k._workspace
    slices, groups = int(launch.grid[1]), -(-int(launch.grid[1]) // 16)
    plane = 9 * c * 4
    start = -(-slices * plane // 256) * 256 + (-(-groups * plane // 256) * 256 if groups > 1 else 0)
    assert int(ws[start:].view(torch.int32).abs().sum()) == 0


def test_speed_against_cudnn(kernels):
    """TFLOP/s and GB/s of each op against cuDNN on depthwise layers (printed; every output checked against
    cuDNN's). Not a speed assertion: the table is the measurement."""
    torch = _gpu()
    import torch.nn.functional as F

    from emitter.families.conv.problem import ConvProblem

    torch.backends.cudnn.benchmark = True
    rows = []
    for label, n, c, h, r, st in LAYERS:
        pad = r // 2
        p = ConvProblem(n=n, h=h, w=h, c=c, k=c, groups=c, r=r, s=r, pad_front=(0, pad, pad), pad_back=(0, pad, pad),
                        stride=(1, st, st))
        _, pp, qq = p.output_extents()
        flops = 2.0 * n * pp * qq * c * r * r
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(c, 1, r, r, device="cuda", dtype=torch.float16)
        dy = torch.randn(n, c, pp, qq, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        stream = torch.cuda.current_stream().cuda_stream
        for op in ("fprop", "dgrad", "wgrad"):
            k = _kernel_for(kernels, op, r, "f16")
            if op == "fprop":
                out = torch.empty(n, c, pp, qq, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
                ptrs = {"x": x.data_ptr(), "w": w.data_ptr(), "y": out.data_ptr()}

                def cudnn():
                    return F.conv2d(x, w, stride=st, padding=pad, groups=c)
                nbytes = (x.numel() + out.numel() + w.numel()) * 2
            elif op == "dgrad":
                out = torch.empty_like(x)
                ptrs = {"x": out.data_ptr(), "w": w.data_ptr(), "y": dy.data_ptr()}

                def cudnn():
                    return torch.ops.aten.convolution_backward(dy, x, w, None, [st, st], [pad, pad], [1, 1], False,
                                                               [0, 0], c, [True, False, False])[0]
                nbytes = (x.numel() + dy.numel() + w.numel()) * 2
            else:
                out = torch.empty_like(w)
                ptrs = {"x": x.data_ptr(), "w": out.data_ptr(), "y": dy.data_ptr()}

                def cudnn():
                    return torch.ops.aten.convolution_backward(dy, x, w, None, [st, st], [pad, pad], [1, 1], False,
                                                               [0, 0], c, [False, True, False])[1]
                nbytes = (x.numel() + dy.numel() + w.numel()) * 2
            packed, launch = k.prepare(p, ptrs, stream)
            t_ours = _time(torch, lambda: k.launch(packed, launch, stream))
            t_cudnn = _time(torch, cudnn)
            want = cudnn().float()
            rel = float((out.float() - want).norm() / want.norm())
            rows.append((label, op, flops / t_ours / 1e12, nbytes / t_ours / 1e9, flops / t_cudnn / 1e12,
                         t_cudnn / t_ours, rel, list(launch.grid)))
            assert rel < 5e-3, (label, op, rel)
    print()
    print(f"{'layer':34s} {'op':6s} {'TFLOP/s':>8s} {'GB/s':>7s} {'cuDNN TFLOP/s':>14s} {'x cuDNN':>8s} {'rel err':>8s}  grid")
    for label, op, tf, gbs, tc, ratio, rel, grid in rows:
        print(f"{label:34s} {op:6s} {tf:8.2f} {gbs:7.0f} {tc:14.2f} {ratio:8.2f} {rel:8.1e}  {grid}")
    for op in ("fprop", "dgrad", "wgrad"):
        ratios = [row[5] for row in rows if row[1] == op]
        geo = 1.0
        for v in ratios:
            geo *= v
        print(f"{op}: geomean x cuDNN {geo ** (1 / len(ratios)):.3f} over {len(ratios)} layers")


# ------------------------------------------------------------------------------------------------ exported library
def _run(cmd, log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    assert r.returncode == 0, f"{cmd[:4]} failed; see {log}"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    import shutil

    _gpu()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _helpers import load_module

    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    work = tmp_path_factory.mktemp("conv_dwsimt_library_gpu")
    log = Path(os.environ.get("OUT", work)) / "conv_dwsimt_library_build.log"
    py = sys.executable
    _run([py, "-m", "emitter", "emit", str(SPEC), "-o", str(work / "gen")], log)
    tree = work / "convdws"
    _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", "convdws", "-o", str(tree)], log)
    _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_CUDA_ARCHITECTURES=80",
          "-DCMAKE_BUILD_TYPE=Release"], log)
    _run(["cmake", "--build", str(tree / "build"), "-j", str(os.cpu_count() or 16)], log)
    so = next(iter(sorted(tree.rglob("libconvdws.so"))))
    mod = load_module("convdws", tree / "python" / "convdws.py")
    mod.load(str(so))
    return mod


@pytest.mark.parametrize("r,st", [(3, 1), (3, 2), (5, 1), (7, 1)])
def test_library_runs_depthwise_wgrad_fprop_and_dgrad_on_the_simt_kernels(lib, r, st):
    """The exported library of configs/conv/depthwise_simt.yaml: conv_select picks the SIMT kernel for a depthwise
    wgrad and fprop (the C API's depthwise-first order), and conv2d_weight_grad / conv2d / conv2d_input_grad (the
    fprop of dy) agree with torch."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(r * 10 + st)
    c, pad = 136, r // 2
    x = torch.randn(4, c, 23, 20, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(c, 1, r, r, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    y = F.conv2d(x, w, stride=st, padding=pad, groups=c)
    gy = torch.randn_like(y).contiguous(memory_format=torch.channels_last)
    sel = lib.conv_select("wgrad", x, None, gy, shape=tuple(w.shape), stride=st, padding=pad, groups=c)
    print("wgrad", r, st, sel)
    assert "conv2d_wgrad_" in sel["kernel"] and f"_dwsimt_f{r}x{r}_" in sel["kernel"], sel
    xs, ws = x.float().requires_grad_(), w.float().requires_grad_()
    gx, gw = torch.autograd.grad(F.conv2d(xs, ws, stride=st, padding=pad, groups=c), (xs, ws), grad_outputs=gy.float())
    got = lib.conv2d_weight_grad(x, gy, tuple(w.shape), stride=st, padding=pad, groups=c)
    torch.cuda.synchronize()
    err = float((got.float() - gw).norm() / gw.norm())
    assert err < 5e-3, ("wgrad", r, st, err)
    sel = lib.conv_select("fprop", x, w, None, stride=st, padding=pad, groups=c)
    assert f"_dwsimt_f{r}x{r}_" in sel["kernel"], sel
    err = float((lib.conv2d(x, w, stride=st, padding=pad, groups=c).float() - y.float()).norm() / y.float().norm())
    assert err < 5e-3, ("fprop", r, st, err)
    sel = lib.conv_select("dgrad", None, w, gy, shape=tuple(x.shape), stride=st, padding=pad, groups=c)
    print("dgrad", r, st, sel.get("route"), sel["kernel"])
    assert "_dwsimt_" in sel["kernel"], sel        # its own dgrad, or the fprop of dy: the route model's choice
    got = lib.conv2d_input_grad(gy, w, tuple(x.shape), stride=st, padding=pad, groups=c)
    err = float((got.float() - gx).norm() / gx.norm())
    assert err < 5e-3, ("dgrad", r, st, err)
