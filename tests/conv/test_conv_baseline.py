"""The conv baseline (emitter.families.conv.baseline) calls cuDNN the way a torch training step does: F.conv2d and
aten.convolution_backward on the caller's real tensors, never torch.nn.grad's zero-strided stand-ins.

Two ways: a recording stand-in for torch (no torch needed) checks which call is made with which tensor objects; with
torch installed (the CPU build in CI), the results match float64 autograd and no argument has a zero stride."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from emitter.families.conv import baseline

ROOT = Path(__file__).resolve().parents[2]


class _T:
    """A tensor stand-in: a name, a rank and strides."""

    def __init__(self, name, shape):
        self.name, self.shape = name, shape
        self._stride = tuple(1 for _ in shape)

    def dim(self):
        return len(self.shape)

    def stride(self):
        return self._stride


def _recording_torch():
    calls = []

    def cb(*args):
        calls.append(("convolution_backward", args))
        return ("gx", "gw", None)

    torch = SimpleNamespace(ops=SimpleNamespace(aten=SimpleNamespace(convolution_backward=cb)))
    return torch, calls


@pytest.mark.parametrize("op,mask,want", [("dgrad", [True, False, False], "gx"), ("wgrad", [False, True, False], "gw")])
def test_backward_baseline_passes_the_real_tensors(op, mask, want):
    torch, calls = _recording_torch()
    x, w, y = _T("x", (2, 8, 9, 9)), _T("w", (4, 8, 3, 3)), _T("y", (2, 4, 9, 9))
    got = baseline.torch_conv(torch, op, x, w, y, stride=(1, 1), padding=1, dilation=1)
    assert got == want
    (name, args), = calls
    assert args[0] is y and args[1] is x and args[2] is w          # the caller's objects, no stand-ins
    assert args[3] is None and list(args[4]) == [1, 1] and list(args[5]) == [1, 1] and list(args[6]) == [1, 1]
    assert args[7] is False and args[8] == [0, 0] and args[9] == 1 and args[10] == mask
    assert "convolution_backward" in baseline.call_name(op)


def test_no_stage_or_bench_times_conv_through_nn_grad():
    """Neither the baseline module, the conv profile hooks nor the bench call torch.nn.grad's helpers as a
    baseline (the bench may time them beside, for the record, under its own name)."""
    for rel in ("emitter/families/conv/baseline.py", "emitter/families/conv/profile.py"):
        tree = ast.parse((ROOT / rel).read_text())
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not attrs & {"conv2d_input", "conv2d_weight", "conv3d_input", "conv3d_weight"}, rel
    bench = (ROOT / "benchmarks/conv_bench.py").read_text()
    start = bench.index("def cudnn(i):")
    src = bench[start:bench.index("\n\n", start)]
    assert "torch_conv(" in src and "nn.grad" not in src
    prof = inspect.getsource(__import__("emitter.families.conv.profile", fromlist=["x"])._torch_conv)
    assert "baseline import torch_conv" in prof


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_torch_baseline_matches_float64_autograd(op):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 8, 11, 9, generator=g).to(memory_format=torch.channels_last)
    w = torch.randn(6, 8, 3, 2, generator=g).to(memory_format=torch.channels_last)
    geo = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    y = torch.nn.functional.conv2d(x, w, **geo)
    dy = torch.randn(y.shape, generator=g).to(memory_format=torch.channels_last)
    seen = []
    real = torch.ops.aten.convolution_backward

    class Spy:
        def __call__(self, *args):
            seen.extend(a for a in args[:3])
            return real(*args)

    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    yd = torch.nn.functional.conv2d(xd, wd, **geo)
    yd.backward(dy.double())
    want = {"fprop": yd.detach(), "dgrad": xd.grad, "wgrad": wd.grad}[op]
    if op == "fprop":
        got = baseline.torch_conv(torch, op, x, w, dy, **geo)
    else:
        import unittest.mock as m
        with m.patch.object(torch.ops.aten, "convolution_backward", Spy()):
            got = baseline.torch_conv(torch, op, x, w, dy, **geo)
        assert seen[0] is dy and seen[1] is x and seen[2] is w
        assert all(0 not in t.stride() for t in seen)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
