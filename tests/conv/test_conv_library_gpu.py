"""The exported library's convolution on a GPU (issue 28 must-have 5): a library of one GEMM kernel per arch (the
library needs them), sm80 f16 fprop / dgrad / wgrad and sm90a f16 fprop / dgrad kernels (unit-stride dgrad only
here, so stride-2 dgrad is a clear refusal; tests/conv/test_conv_dgrad_gpu.py exports a strided dgrad kernel)
(emit -> export -> CMake, about 2-3 minutes on 16 cores), then conv2d / conv2d_input_grad / conv2d_weight_grad
on channels_last torch tensors against torch (odd H/W, stride 2, padding, dilation, asymmetric padding), every
kernel forced by name once, refusals (C = 3 with stream=, bias without a bias kernel) as clear errors, torch.compile
(fullgraph=True) and CUDA graph capture + replay; a small CNN's training step through conv2d's autograd (the
library's dgrad / wgrad, the first layer's C = 3 padded) against torch's own gradients, eager, under torch.compile
(fullgraph=True) and in a CUDA graph.

$EMITTER_CONV_LIBRARY: an exported and built tree to use instead of building one."""

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
NAME = "convgpu"

SPEC = GEMM_SPEC_NO_SWIZZLE + CONV_SM80_F16_ENTRY + """\
  - family: conv
    arch: sm90a
    op: [fprop, dgrad]
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    cluster: 1x1x1
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
    given = os.environ.get("EMITTER_CONV_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("conv_library_gpu")
        log = Path(os.environ.get("OUT", work)) / "conv_library_build.log"
        spec = work / "spec.yaml"
        spec.write_text(SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", str(spec), "-o", str(work / "gen")], log)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree)], log)
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        # sm80 kernels also as sm_90 SASS on Hopper (no PTX JIT at the first launch)
        archs = "80;90;90a" if torch.cuda.get_device_capability(0) == (9, 0) else "80"
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
              "-DCMAKE_BUILD_TYPE=Release"], log)
        _run(["cmake", "--build", str(tree / "build"), "-j", os.environ.get("EMITTER_TEST_JOBS", "16")], log)
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def cl(torch, *shape, dtype=None):
    return torch.randn(*shape, device="cuda", dtype=dtype or torch.float16).to(memory_format=torch.channels_last)


def _check(got, want, what: str) -> None:
    assert got.is_contiguous(memory_format=__import__("torch").channels_last), what
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    assert err < 1e-2, f"{what}: max relative error {err:.3e}"


# (N, C, H, W, K, R, S, stride, padding, dilation)
CASES = [
    (3, 16, 13, 11, 24, 3, 3, 1, 1, 1),
    (2, 32, 15, 9, 40, 3, 3, 2, 1, 1),
    (2, 16, 9, 10, 8, 1, 1, 1, 0, 1),
    (1, 24, 17, 13, 16, 3, 3, 1, (1, 2), (2, 1)),
    (2, 8, 23, 19, 16, 7, 7, 2, 3, 1),
]


def _pair(v):
    return v if isinstance(v, tuple) else (v, v)


def _forced(lib, fn, name, dil_, stride_, *args, **kw):
    """fn(..., kernel=name), or None where the kernel legitimately refuses (a unity-stride kernel at stride 2, an sm90a
    kernel at dilation 2). (dil_/stride_ are named apart from fn's own stride/dilation keywords, passed in kw.)"""
    try:
        return fn(*args, kernel=name, **kw)
    except lib.Error as e:
        if e.status == 1 and (("unity" in name and stride_ != 1) or ("sm90a" in name and dil_ != 1)):
            return None
        raise


def test_conv2d_and_grads_against_torch(lib):
    import torch
    import torch.nn.functional as F

    names = lib.conv_kernels()
    hopper = torch.cuda.get_device_capability(0) == (9, 0)
    usable = [n for n in names if "sm80" in n or hopper]
    ran = set()
    for n, c, h, w, k, r, s, stride, pad, dil in CASES:
        x, wt = cl(torch, n, c, h, w), cl(torch, k, c, r, s)
        geo = dict(stride=stride, padding=pad, dilation=dil)
        tgeo = dict(stride=_pair(stride), padding=_pair(pad), dilation=_pair(dil))
        what = f"{(n, c, h, w, k, r, s)} {geo}"
        want = F.conv2d(x.double(), wt.double(), **tgeo)
        _check(lib.conv2d(x, wt, **geo), want, f"conv2d {what}")
        sel = lib.conv_select("fprop", x, wt, None, **geo)
        if dil == 1:
            assert ("sm90a" in sel["kernel"]) == hopper, sel     # static priority: sm90a first on cc 9.0
        out = torch.empty_like(want, dtype=torch.float16).to(memory_format=torch.channels_last)
        assert lib.conv2d(x, wt, out=out, **geo) is out
        _check(out, want, "conv2d out=")
        gy = cl(torch, *want.shape)
        want_dx = torch.nn.grad.conv2d_input(x.shape, wt.double(), gy.double(), **tgeo)
        if stride == 1:
            _check(lib.conv2d_input_grad(gy, wt, tuple(x.shape), **geo), want_dx, f"conv2d_input_grad {what}")
        else:                         # no strided dgrad kernel in this library (unit-stride dgrad only): a clear refusal
            with pytest.raises(lib.Error) as e:
                lib.conv2d_input_grad(gy, wt, tuple(x.shape), **geo)
            assert e.value.status == 1 and "can implement" in str(e.value)
        want_dw = torch.nn.grad.conv2d_weight(x.double(), wt.shape, gy.double(), **tgeo)
        _check(lib.conv2d_weight_grad(x, gy, tuple(wt.shape), **geo), want_dw, f"conv2d_weight_grad {what}")
        for name in usable:           # every kernel forced by name
            if "fprop" in name:
                got, ref = _forced(lib, lib.conv2d, name, dil, stride, x, wt, **geo), want
            elif "dgrad" in name:
                got, ref = _forced(lib, lib.conv2d_input_grad, name, dil, stride, gy, wt, tuple(x.shape), **geo), want_dx
            else:
                got, ref = _forced(lib, lib.conv2d_weight_grad, name, dil, stride, x, gy, tuple(wt.shape), **geo), want_dw
            if got is not None:
                _check(got, ref, f"forced {name} on {what}")
                ran.add(name)
    torch.cuda.synchronize()
    assert ran == set(usable), sorted(set(usable) - ran)


def test_refusals_are_clear(lib):
    import torch

    x, wt = cl(torch, 2, 3, 9, 9), cl(torch, 8, 3, 3, 3)
    with pytest.raises(lib.Error) as e:      # C = 3 is padded to 8 except with an explicit stream=
        lib.conv2d(x, wt, padding=1, stream=torch.cuda.current_stream())
    assert e.value.status == 1 and "can implement" in str(e.value)
    x, wt = cl(torch, 2, 16, 9, 9), cl(torch, 8, 16, 3, 3)
    with pytest.raises(lib.Error) as e:      # no bias kernel in this library
        lib.conv2d(x, wt, padding=1, bias=torch.zeros(8, device="cuda", dtype=torch.float16))
    assert e.value.status == 1 and "bias" in str(e.value)
    with pytest.raises(lib.OperandError, match="not channels_last"):
        lib.conv2d(x.contiguous(), wt, padding=1)
    with pytest.raises(lib.OperandError, match="groups = 1"):
        lib.conv2d(x, cl(torch, 8, 8, 3, 3), padding=1)


def test_torch_compile_fullgraph(lib):
    import importlib.util as iu

    import torch
    import torch.nn.functional as F

    x, wt = cl(torch, 2, 16, 13, 11), cl(torch, 24, 16, 3, 3)
    gy = cl(torch, 2, 24, 13, 11)

    def f(x, wt, gy):
        y = lib.conv2d(x, wt, stride=2, padding=1)
        dx = lib.conv2d_input_grad(gy, wt, (2, 16, 13, 11), padding=1)
        dw = lib.conv2d_weight_grad(x, gy, (24, 16, 3, 3), padding=(1, 1))
        return y * 2 + 1, dx, dw

    want = (F.conv2d(x.double(), wt.double(), stride=2, padding=1) * 2 + 1,
            torch.nn.grad.conv2d_input(x.shape, wt.double(), gy.double(), padding=1),
            torch.nn.grad.conv2d_weight(x.double(), wt.shape, gy.double(), padding=1))
    assert getattr(torch.ops, lib.NAME).conv2d is not None
    backends = ("eager", "aot_eager") + (("inductor",) if iu.find_spec("triton") else ())
    for backend in backends:
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend=backend)(x, wt, gy)
        torch.cuda.synchronize()
        for g, w_, what in zip(got, want, ("conv2d", "conv2d_input_grad", "conv2d_weight_grad")):
            err = ((g.double() - w_).abs().max() / w_.abs().max()).item()
            assert err < 1e-2, f"torch.compile(backend={backend!r}) {what}: {err:.3e}"


def test_cuda_graph_capture_and_replay(lib):
    import torch
    import torch.nn.functional as F

    x, wt = cl(torch, 4, 32, 15, 13), cl(torch, 40, 32, 3, 3)
    out = torch.empty(4, 40, 15, 13, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            lib.conv2d(x, wt, padding=1, out=out)
            y = lib.conv2d(x, wt, padding=1)
            dw = lib.conv2d_weight_grad(x, out, (40, 32, 3, 3), padding=1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lib.conv2d(x, wt, padding=1, out=out)
        y = lib.conv2d(x, wt, padding=1)
        dw = lib.conv2d_weight_grad(x, out, (40, 32, 3, 3), padding=1)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        want = F.conv2d(x.double(), wt.double(), padding=1)
        _check(out, want, "out= in a CUDA graph replay")
        _check(y, want, "allocated output in a CUDA graph replay")
        _check(dw, torch.nn.grad.conv2d_weight(x.double(), wt.shape, out.double(), padding=1), "wgrad in a replay")


# ---- training through the library: conv2d's autograd (dgrad / wgrad kernels), C = 3 padded ---------------------

def _net(conv, x, ws):
    """A small CNN: C = 3 -> 16 (3x3), 16 -> 32 (3x3, dilation 2), 32 -> 16 (1x1), ReLU between."""
    h = conv(x, ws[0], padding=1).relu()
    h = conv(h, ws[1], padding=2, dilation=2).relu()
    return conv(h, ws[2])


def _net_case(torch, n=4, h=13, w=11):
    x = cl(torch, n, 3, h, w)
    ws = [cl(torch, 16, 3, 3, 3) * 0.5, cl(torch, 32, 16, 3, 3) * 0.25, cl(torch, 16, 32, 1, 1) * 0.25]
    return x, [t.contiguous(memory_format=torch.channels_last) for t in ws], torch.randn(n, 16, h, w, device="cuda")


def _net_grads(conv, x, ws, target, dtype, x_grad):
    import torch

    xs = x.detach().to(dtype).contiguous(memory_format=torch.channels_last).requires_grad_(x_grad)
    ps = [w.detach().to(dtype).contiguous(memory_format=torch.channels_last).requires_grad_() for w in ws]
    y = _net(conv, xs, ps)
    loss = (y * target.double()).sum() if dtype == torch.float64 else (y.float() * target).sum()
    loss.backward()
    return ([xs.grad] if x_grad else []) + [p.grad for p in ps]


def _rel(got, ref) -> float:
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def _judge(got, torch_own, ref, what):
    """The library's gradients against float64, as close as torch's own f16 convolution's (cuDNN) are, or 1e-2."""
    for i, (g, t, r) in enumerate(zip(got, torch_own, ref)):
        assert g.shape == r.shape, (what, i, g.shape, r.shape)
        e, et = _rel(g, r), _rel(t, r)
        assert e < max(1e-2, 4 * et), f"{what}: gradient {i}: library {e:.3e}, torch {et:.3e} against float64"


def test_training_step_gradients_match_torch(lib):
    """loss.backward() through lib.conv2d (autograd -> the library's dgrad / wgrad; layer 1's C = 3 padded to 8) gives
    the gradients torch's own f16 conv2d gives, both against float64 -- for the input too (the padded dgrad)."""
    import torch
    import torch.nn.functional as F

    x, ws, target = _net_case(torch)
    for x_grad in (False, True):
        ref = _net_grads(F.conv2d, x, ws, target, torch.float64, x_grad)
        own = _net_grads(F.conv2d, x, ws, target, torch.float16, x_grad)
        got = _net_grads(lib.conv2d, x, ws, target, torch.float16, x_grad)
        torch.cuda.synchronize()
        _judge(got, own, ref, f"eager, x.requires_grad={x_grad}")
        for g in got:
            assert g.dtype == torch.float16 and g.is_contiguous(memory_format=torch.channels_last)
    y = lib.conv2d(x, ws[0], padding=1)                # C = 3 without autograd: the padded fprop
    _check(y, F.conv2d(x.double(), ws[0].double(), padding=1), "conv2d C = 3")


def test_training_step_under_torch_compile_fullgraph(lib):
    import importlib.util as iu

    import torch
    import torch.nn.functional as F

    x, ws, target = _net_case(torch)
    ref = _net_grads(F.conv2d, x, ws, target, torch.float64, False)
    own = _net_grads(F.conv2d, x, ws, target, torch.float16, False)

    def loss_fn(x, p0, p1, p2, target):
        return (_net(lib.conv2d, x, [p0, p1, p2]).float() * target).sum()

    for backend in ("aot_eager",) + (("inductor",) if iu.find_spec("triton") else ()):
        torch._dynamo.reset()
        ps = [w.detach().clone().requires_grad_() for w in ws]
        loss = torch.compile(loss_fn, fullgraph=True, backend=backend)(x, *ps, target)
        loss.backward()
        torch.cuda.synchronize()
        _judge([p.grad for p in ps], own, ref, f"torch.compile(fullgraph=True, backend={backend!r})")


def test_training_step_in_a_cuda_graph(lib):
    """forward + loss.backward() + an SGD update captured once, replayed on new inputs: the gradients of each replay
    match float64, the update is applied (no host sync inside: the capture would fail)."""
    import torch
    import torch.nn.functional as F

    x, ws, target = _net_case(torch)
    ps = [w.detach().clone().requires_grad_() for w in ws]
    lr = 1e-3

    def step():
        loss = (_net(lib.conv2d, x, ps).float() * target).sum()
        loss.backward()
        with torch.no_grad():
            for p in ps:
                p.sub_(lr * p.grad)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            for p in ps:
                p.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    for p in ps:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        before = [p.detach().clone() for p in ps]
        ref = _net_grads(F.conv2d, x, before, target, torch.float64, False)
        own = _net_grads(F.conv2d, x, before, target, torch.float16, False)
        graph.replay()
        torch.cuda.synchronize()
        _judge([p.grad for p in ps], own, ref, "CUDA graph replay")
        for p, b in zip(ps, before):     # the update, to f16 rounding
            assert not torch.equal(p.detach(), b) and (p.detach() - (b - lr * p.grad)).abs().max().item() <= 1e-3
