"""Every route of a grouped convolution through the exported library on a GPU, against torch (cuDNN, f32): the library
of benchmarks/conv_grouped_bench.py (configs/conv/grouped.yaml + configs/conv/depthwise.yaml: CUTLASS 2.x grouped
fprop, sm80 and sm90a ungrouped kernels, sm90a split-K wgrad, depthwise direct), built with CMake.

* each route the loader's cost model prices for a problem (grouped kernel, a launch a group from the C API or from the
  loader, block-diagonal dense, depthwise dgrad as the fprop of dy), forced in turn: conv2d / conv2d_input_grad /
  conv2d_weight_grad equal to torch's, out= written in place, channels_last kept;
* the model's own choice where it is clear: ResNeXt's 4 channels a group on the dense kernels, two groups of 128 on
  per-group sm90a launches, depthwise fprop on the depthwise direct kernel; conv2d's autograd through the routes.

$EMITTER_CONV_GROUPED_ROUTES_LIBRARY: a built tree of the bench (<out>/convgrouped) to use instead of building one."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "convgrouped"
SPECS = [ROOT / "configs/conv/grouped.yaml", ROOT / "configs/conv/depthwise.yaml"]


def _run(cmd, log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    assert r.returncode == 0, f"{cmd[:4]} failed; see {log}"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100 / H200) visible to torch: the dense routes run sm90a kernels")
    given = os.environ.get("EMITTER_CONV_GROUPED_ROUTES_LIBRARY")
    if given:
        tree = Path(given)
    else:
        if shutil.which("cmake") is None:
            pytest.skip("cmake not found")
        work = tmp_path_factory.mktemp("conv_grouped_routes_gpu")
        log = Path(os.environ.get("OUT", work)) / "conv_grouped_routes_build.log"
        py = sys.executable
        _run([py, "-m", "emitter", "emit", *map(str, SPECS), "-o", str(work / "gen"), "-q"], log)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", str(work / "gen"), "--name", NAME, "-o", str(tree), "--exclude",
              "*bf16*"], log)     # f16 only, as the bench
        _run(["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_CUDA_ARCHITECTURES=80;90a",
              "-DCMAKE_BUILD_TYPE=Release"], log)
        _run(["cmake", "--build", str(tree / "build"), "-j", os.environ.get("EMITTER_TEST_JOBS", "16")], log)
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))))
    mod = load_module(f"{NAME}_routes_gpu", tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def cl(torch, *shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).half().to(memory_format=torch.channels_last)


def _close(got, want, what: str) -> None:
    err = ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-6)).item()
    assert err < 1e-2, f"{what}: max relative error {err:.3e}"


@contextlib.contextmanager
def forced(lib, route):
    """The loader's route decisions with `route` taken wherever the model priced it (elsewhere the model's own)."""
    real = lib._conv_group_route

    def pick(*args, **kw):
        dec = real(*args, **kw)
        if route in dec["costs"]:
            dec = dict(dec, route="as-given" if route in ("grouped", "per-group") else route, code=route)
        return dec

    lib._conv_group_route = pick
    lib._CONV_ROUTES.clear()
    try:
        yield
    finally:
        lib._conv_group_route = real
        lib._CONV_ROUTES.clear()


# (N, C, H, W, K, groups, R, stride, padding)
CASES = [
    (4, 128, 14, 13, 128, 32, 3, 1, 1),      # ResNeXt: 4 channels a group
    (2, 64, 15, 14, 128, 32, 3, 2, 1),       # 2 -> 4 channels a group, stride 2
    (2, 256, 9, 11, 256, 2, 3, 1, 1),        # two groups of 128
    (2, 64, 16, 15, 64, 64, 3, 1, 1),        # depthwise
    (2, 96, 17, 15, 96, 96, 3, 2, 1),        # depthwise, stride 2
]


@pytest.mark.parametrize("case", CASES, ids=[f"g{c[5]}_c{c[1]}_s{c[7]}" for c in CASES])
def test_every_priced_route_matches_torch(lib, case):
    import torch
    import torch.nn.functional as F

    n, c, h, w_, k, g, r, stride, pad = case
    geo = dict(stride=stride, padding=pad, groups=g)
    x, w = cl(torch, n, c, h, w_), cl(torch, k, c // g, r, r, scale=0.3)
    xs, ws = x.float().requires_grad_(), w.float().requires_grad_()
    ys = F.conv2d(xs, ws, **geo)
    gy = torch.randn_like(ys).half().contiguous(memory_format=torch.channels_last)
    gx, gw = torch.autograd.grad(ys, (xs, ws), grad_outputs=gy.float())
    tried = {}
    for op in ("fprop", "dgrad", "wgrad"):
        args = {"fprop": (x, w, None), "dgrad": (None, w, gy), "wgrad": (x, None, gy)}[op]
        shape = {"fprop": None, "dgrad": tuple(x.shape), "wgrad": tuple(w.shape)}[op]
        sel = lib.conv_select(op, *args, shape=shape, **geo)
        assert sel["reason"].startswith(("depthwise dgrad", sel["route"])) and "cost model: " in sel["reason"], sel
        assert "dense" in sel["costs_us"], sel            # every case here is small enough for the dense weight
        tried[op] = sorted(sel["costs_us"])
        for route in sel["costs_us"]:
            with forced(lib, route):
                what = f"{op} by {route} {case}"
                if op == "fprop":
                    want = ys.detach()
                    got = lib.conv2d(x, w, **geo)
                    out = torch.empty_like(got)
                    assert lib.conv2d(x, w, out=out, **geo) is out
                elif op == "dgrad":
                    want = gx
                    got = lib.conv2d_input_grad(gy, w, x.shape, **geo)
                    out = torch.empty_like(x)
                    assert lib.conv2d_input_grad(gy, w, x.shape, out=out, **geo) is out
                else:
                    want = gw
                    got = lib.conv2d_weight_grad(x, gy, w.shape, **geo)
                    out = torch.empty_like(w)
                    assert lib.conv2d_weight_grad(x, gy, w.shape, out=out, **geo) is out
                torch.cuda.synchronize()
                assert got.shape == want.shape and got.is_contiguous(memory_format=torch.channels_last), what
                _close(got, want, what)
                _close(out, want, what + " (out=)")
    print(case, tried)
    assert sum(len(v) for v in tried.values()) >= 5, tried     # more than one route for most ops


def test_the_model_choice_where_it_is_clear(lib):
    import torch

    def routes(n, c, h, k, g, r=3, stride=1):
        x, w = cl(torch, n, c, h, h), cl(torch, k, c // g, r, r)
        y = lib.conv2d(x, w, stride=stride, padding=r // 2, groups=g)
        out = {}
        for op, args, shape in (("fprop", (x, w, None), None), ("dgrad", (None, w, y), tuple(x.shape)),
                                ("wgrad", (x, None, y), tuple(w.shape))):
            out[op] = lib.conv_select(op, *args, shape=shape, stride=stride, padding=r // 2, groups=g)
        return out

    for stride in (1, 2):      # ResNeXt-50 32x4d conv2 / conv3
        for op, sel in routes(32, 128 * stride, 56, 128 * stride, 32, stride=stride).items():
            if op == "dgrad" and stride == 2:    # sm80's strided dgrad: dense and a launch a group priced alike
                continue
            assert min(sel["costs_us"].values()) * 5 < max(sel["costs_us"].values()), (op, stride, sel)
            assert sel["route"] == "block-diagonal dense (32x the FLOPs)", (op, stride, sel)
            assert "_sm90a_" in sel["kernel"], (op, stride, sel)
    sel = routes(32, 256, 56, 256, 2)["fprop"]
    assert sel["route"] == "2 launches (a group each)" and "_sm90a_" in sel["kernel"], sel
    assert sel["costs_us"]["slices"] < sel["costs_us"]["grouped"], sel
    sel = routes(32, 144, 56, 144, 144)
    assert sel["fprop"]["route"] == "grouped kernel" and "_dwdirect_" in sel["fprop"]["kernel"], sel["fprop"]
    assert sel["dgrad"]["reason"].startswith("depthwise dgrad as the fprop of dy"), sel["dgrad"]


def test_autograd_through_the_routes(lib):
    import torch
    import torch.nn.functional as F

    x = cl(torch, 4, 128, 14, 14).requires_grad_()
    w = cl(torch, 128, 4, 3, 3, scale=0.3).requires_grad_()          # ResNeXt: the dense route
    w2 = cl(torch, 128, 1, 3, 3, scale=0.3).requires_grad_()         # depthwise
    y = lib.conv2d(lib.conv2d(x, w, padding=1, groups=32), w2, padding=1, groups=128)
    gy = torch.randn_like(y)
    y.backward(gy)
    xs, ws, w2s = (t.detach().float().requires_grad_() for t in (x, w, w2))
    F.conv2d(F.conv2d(xs, ws, padding=1, groups=32), w2s, padding=1, groups=128).backward(gy.float())
    for got, want, what in ((x.grad, xs.grad, "x"), (w.grad, ws.grad, "w"), (w2.grad, w2s.grad, "w2")):
        _close(got, want, f"autograd {what}")
