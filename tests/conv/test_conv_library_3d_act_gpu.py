"""The exported library's conv3d and fused activations from Python on a GPU: a conv-only library (emit -> export ->
CMake) of configs/conv/verify_set.yaml's 3D instances (sm80 f16 fprop with its ops extended to wgrad, the analytic
strided 3D dgrad, the sm90a 3D fprop), its sm90a fused bias + ReLU fprop, an sm80 fused SiLU fprop and the sm80 2D
f16 fprop / dgrad / wgrad (the backward of a fused 2D call); then

* conv3d / conv3d_input_grad / conv3d_weight_grad on channels_last_3d tensors against torch in float64 (odd extents,
  per-mode stride, padding and dilation), every 3D kernel forced by name once;
* conv3d's autograd (the library's 3D dgrad / wgrad kernels) against float64 autograd, eager and under
  torch.compile(fullgraph=True);
* conv2d(activation="relu", bias=) (Hopper: the sm90a relu + bias kernel) and conv2d(activation="silu") against
  F.conv2d + the activation; gelu, which no kernel has, NOT_SUPPORTED naming the library's epilogues; the backward
  through the fused relu (the mask from the output) against float64.

$EMITTER_CONV3D_LIBRARY: an exported and built tree of this spec to use instead of building one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import CONV_SM80_F16_ENTRY, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "conv3dgpu"

SPEC = "kernels:\n" + CONV_SM80_F16_ENTRY + """\
  - family: conv
    arch: sm80
    op: [fprop, wgrad]
    dims: 3
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x32
    warp: 64x64x32
    stages: 4
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
    op: fprop
    dims: 3
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
  - family: conv
    arch: sm90a
    op: fprop
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x128x64
    epilogue: {activation: relu, bias: true}
  - family: conv
    arch: sm80
    op: fprop
    dtype: {a: f16, c: f16, accumulator: f32, epilogue: f32}
    tile: 128x64x64
    warp: 64x32x64
    stages: 3
    epilogue: silu
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
    given = os.environ.get("EMITTER_CONV3D_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("conv3d_library_gpu")
        log = Path(os.environ.get("OUT", work)) / "conv3d_library_build.log"
        spec = work / "spec.yaml"
        spec.write_text(SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", str(spec), "-o", str(work / "gen")], log)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree)], log)
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        archs = "80;90;90a" if torch.cuda.get_device_capability(0) == (9, 0) else "80"
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
              "-DCMAKE_BUILD_TYPE=Release"], log)
        _run(["cmake", "--build", str(tree / "build"), "-j", os.environ.get("EMITTER_TEST_JOBS", "16")], log)
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def _hopper() -> bool:
    import torch

    return torch.cuda.get_device_capability(0) == (9, 0)


def cl3(torch, *shape, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float16) * scale).to(memory_format=torch.channels_last_3d)


def _rel(got, ref) -> float:
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def _check(got, want, what: str, fmt=None) -> None:
    import torch

    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.is_contiguous(memory_format=fmt or torch.channels_last_3d), what
    err = _rel(got, want)
    assert err < 1e-2, f"{what}: max relative error {err:.3e}"


# (N, C, D, H, W, K, T, R, S, stride, padding, dilation)
CASES3 = [
    (2, 16, 6, 9, 7, 24, 3, 3, 3, 1, 1, 1),
    (2, 32, 5, 11, 9, 16, 3, 3, 3, (1, 2, 2), (1, 1, 0), 1),
    (1, 8, 7, 6, 5, 8, 1, 1, 1, 1, 0, 1),
    (2, 16, 9, 7, 8, 8, 3, 1, 3, 1, (2, 0, 1), (2, 1, 1)),
]


def _triple(v):
    return v if isinstance(v, tuple) else (v, v, v)


def test_conv3d_and_its_grads_against_torch(lib):
    import torch
    import torch.nn.functional as F

    names3 = [n for n in lib.conv_kernels() if n.startswith("conv3d_") and ("sm80" in n or _hopper())]
    assert len(names3) == (4 if _hopper() else 3), lib.conv_kernels()
    ran, refused = set(), []
    for n, c, d, h, w, k, t, r, s, stride, pad, dil in CASES3:
        x, wt = cl3(torch, n, c, d, h, w), cl3(torch, k, c, t, r, s)
        geo = dict(stride=stride, padding=pad, dilation=dil)
        tgeo = dict(stride=_triple(stride), padding=_triple(pad), dilation=_triple(dil))
        what = f"{(n, c, d, h, w, k, t, r, s)} {geo}"
        want = F.conv3d(x.double(), wt.double(), **tgeo)
        _check(lib.conv3d(x, wt, **geo), want, f"conv3d {what}")
        assert lib.conv_select("fprop", x, wt, None, **geo)["kernel"].startswith("conv3d_fprop")
        out = torch.empty_like(want, dtype=torch.float16).to(memory_format=torch.channels_last_3d)
        assert lib.conv3d(x, wt, out=out, **geo) is out
        _check(out, want, f"conv3d out= {what}")
        gy = cl3(torch, *want.shape)
        # dgrad at dilation 1 only: CUTLASS's strided dgrad refuses dilation > 1 in H / W and is not verified with a
        # depth dilation (its can_implement does not look at it)
        dgrad = dil == 1
        want_dx = torch.nn.grad.conv3d_input(x.shape, wt.double(), gy.double(), **tgeo) if dgrad else None
        want_dw = torch.nn.grad.conv3d_weight(x.double(), wt.shape, gy.double(), **tgeo)
        if dgrad:
            _check(lib.conv3d_input_grad(gy, wt, tuple(x.shape), **geo), want_dx, f"conv3d_input_grad {what}")
        _check(lib.conv3d_weight_grad(x, gy, tuple(wt.shape), **geo), want_dw, f"conv3d_weight_grad {what}")
        for name in names3:          # every 3D kernel forced by name; a kernel may refuse a case (status 1)
            if "_dgrad_" in name and not dgrad:
                continue
            try:
                if "_fprop_" in name:
                    got, ref = lib.conv3d(x, wt, kernel=name, **geo), want
                elif "_dgrad_" in name:
                    got, ref = lib.conv3d_input_grad(gy, wt, tuple(x.shape), kernel=name, **geo), want_dx
                else:
                    got, ref = lib.conv3d_weight_grad(x, gy, tuple(wt.shape), kernel=name, **geo), want_dw
            except lib.Error as e:
                if e.status == 1:
                    refused.append((name, what, str(e)))
                    continue
                raise
            _check(got, ref, f"forced {name} on {what}")
            ran.add(name)
    torch.cuda.synchronize()
    assert ran == set(names3), (sorted(set(names3) - ran), refused)
    with pytest.raises(lib.OperandError, match="not channels_last_3d"):
        lib.conv3d(cl3(torch, 2, 16, 4, 5, 6).contiguous(), cl3(torch, 8, 16, 3, 3, 3), padding=1)


def _grads(fn, x, w, gy, dtype, **geo):
    """fn(x, w) in `dtype` (channels_last_3d), (fn(...) * gy).sum() backward: the output and [grad x, grad w]."""
    import torch

    f = torch.channels_last_3d
    xs = x.detach().to(dtype).contiguous(memory_format=f).requires_grad_()
    ws = w.detach().to(dtype).contiguous(memory_format=f).requires_grad_()
    y = fn(xs, ws, **geo)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    (y.to(acc) * gy.to(acc)).sum().backward()
    return y, [xs.grad, ws.grad]


def test_conv3d_autograd_eager_and_under_torch_compile(lib):
    """loss.backward() through lib.conv3d: the library's 3D dgrad (strided) and wgrad kernels (no bias: no 3D kernel
    here fuses one) against float64 autograd of F.conv3d."""
    import torch
    import torch.nn.functional as F

    x, w = cl3(torch, 2, 16, 5, 9, 7), cl3(torch, 24, 16, 3, 3, 3, scale=0.25)
    geo = dict(stride=(1, 2, 1), padding=1)
    gy = torch.randn(F.conv3d(x.double(), w.double(), **geo).shape, device="cuda")
    ref_y, ref = _grads(F.conv3d, x, w, gy, torch.float64, **geo)

    def f(x, w, **g):
        return lib.conv3d(x, w, **g)

    y, got = _grads(f, x, w, gy, torch.float16, **geo)
    torch.cuda.synchronize()
    _check(y, ref_y, "conv3d forward (autograd)")
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape and g.is_contiguous(memory_format=torch.channels_last_3d), i
        assert _rel(g, r) < 1e-2, ("eager", i, _rel(g, r))
    torch._dynamo.reset()
    y, got = _grads(torch.compile(f, fullgraph=True, backend="aot_eager"), x, w, gy, torch.float16, **geo)
    torch.cuda.synchronize()
    _check(y, ref_y, "conv3d forward under torch.compile(fullgraph=True)")
    for i, (g, r) in enumerate(zip(got, ref)):
        assert _rel(g, r) < 1e-2, ("torch.compile", i, _rel(g, r))


def test_fused_relu_and_silu_against_torch(lib):
    import torch
    import torch.nn.functional as F

    cl_ = torch.channels_last
    x = torch.randn(2, 32, 13, 11, device="cuda", dtype=torch.float16).to(memory_format=cl_)
    w = (torch.randn(24, 32, 3, 3, device="cuda", dtype=torch.float16) * 0.25).to(memory_format=cl_)
    b = torch.randn(24, device="cuda", dtype=torch.float16)
    z = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    z0 = F.conv2d(x.double(), w.double(), padding=1)
    y = lib.conv2d(x, w, padding=1, activation="silu")
    _check(y, F.silu(z0), "conv2d activation='silu'", cl_)
    assert "_silu" in lib.conv_select("fprop", x, w, None, padding=1, activation="silu")["kernel"]
    with pytest.raises(lib.Error) as e:
        lib.conv2d(x, w, padding=1, activation="gelu")
    assert e.value.status == 1 and "relu + bias" in str(e.value) and "silu" in str(e.value), str(e.value)
    if not _hopper():
        pytest.skip("the relu + bias kernel is sm90a")
    sel = lib.conv_select("fprop", x, w, None, padding=1, bias=b, activation="relu")
    assert "_relu_bias" in sel["kernel"], sel
    y = lib.conv2d(x, w, padding=1, bias=b, activation="relu")
    _check(y, F.relu(z), "conv2d activation='relu' bias=", cl_)
    assert (y == 0).any() and (y > 0).any()
    # the backward through the fused relu: the mask is the library's output's (y > 0), the rest float64 torch
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    gy = torch.randn(y.shape, device="cuda")
    y2 = lib.conv2d(xs, ws, padding=1, bias=bs, activation="relu")
    (y2.float() * gy).sum().backward()
    torch.cuda.synchronize()
    assert torch.equal(y2.detach(), y)
    gz = gy.double() * (y > 0)
    want = (torch.nn.grad.conv2d_input(x.shape, w.double(), gz, padding=1),
            torch.nn.grad.conv2d_weight(x.double(), w.shape, gz, padding=1), gz.sum(dim=(0, 2, 3)))
    for i, (g, r) in enumerate(zip((xs.grad, ws.grad, bs.grad), want)):
        assert g.shape == r.shape and _rel(g, r) < 1e-2, (i, _rel(g, r))
    with pytest.raises(lib.OperandError, match="pre-activation"):
        lib.conv2d(xs, ws, padding=1, activation="silu")
