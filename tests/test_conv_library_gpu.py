"""The exported library's convolution on a GPU (issue 28 must-have 5): a library of one GEMM kernel per arch (the
library needs them), sm80 f16 fprop / dgrad / wgrad and sm90a f16 fprop / dgrad kernels (dgrad is unit-stride
only in emitter: CUTLASS's strided-dgrad kernels are not built)
(emit -> export -> CMake, about 2-3 minutes on 16 cores), then conv2d / conv2d_input_grad / conv2d_weight_grad
on channels_last torch tensors against torch (odd H/W, stride 2, padding, dilation, asymmetric padding), every
kernel forced by name once, refusals (C = 3, bias without a bias kernel) as clear errors, torch.compile
(fullgraph=True) and CUDA graph capture + replay.

$EMITTER_CONV_LIBRARY: an exported and built tree to use instead of building one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _helpers import CONV_SM80_F16_ENTRY, GEMM_SPEC_NO_SWIZZLE, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
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
        else:                         # no strided dgrad kernel in emitter (unit-stride dgrad only): a clear refusal
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
    with pytest.raises(lib.Error) as e:      # C = 3: these kernels need C % 8 == 0 (no fixed-channel kernel here)
        lib.conv2d(x, wt, padding=1)
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
