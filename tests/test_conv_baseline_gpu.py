"""On the GPU: the conv profiler's cuDNN baseline is as fast as what autograd runs.

`emitter profile`'s conv baseline (emitter.families.conv.profile.baseline, which calls
emitter.families.conv.baseline.torch_conv) is timed against `torch.ops.aten.convolution_backward` called directly
on the same channels_last tensors (what a training step runs); the test fails if the profiler's baseline is more
than 10% slower on any layer. It also times torch.nn.grad's helpers (the stand-in baseline of tables before
2026-11-27) to show the check tells a slow baseline apart: on the 1x1 dgrad layer they were 13x slower.
"""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu

# (label, op, c, hw, k, rs, pad), N = 32: the layers where the stand-in baseline was slowest
LAYERS = [
    ("C64 56² K64 3x3 dgrad", "dgrad", 64, 56, 64, 3, 1),
    ("C64 56² K256 1x1 dgrad", "dgrad", 64, 56, 256, 1, 0),
    ("C256 56² K64 1x1 dgrad", "dgrad", 256, 56, 64, 1, 0),
    ("C64 56² K64 3x3 wgrad", "wgrad", 64, 56, 64, 3, 1),
    ("C256 14² K256 3x3 wgrad", "wgrad", 256, 14, 256, 3, 1),
]


def _gpu():
    pytest.importorskip("pycuda")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    return torch, drv


def _median_ms(torch, fns: dict, reps: int = 15, calls: int = 20, warmup: int = 10) -> dict:
    """Equal warm-up, then `reps` batches of `calls` back-to-back calls per function between two events, the
    functions in alternation; median ms per call."""
    for fn in fns.values():
        for i in range(warmup):
            fn(i)
    torch.cuda.synchronize()
    out = {n: [] for n in fns}
    for _ in range(reps):
        for n, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(calls):
                fn(i)
            b.record()
            b.synchronize()
            out[n].append(a.elapsed_time(b) / calls)
    return {n: statistics.median(v) for n, v in out.items()}


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layer", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_profiler_baseline_is_what_autograd_runs(layer, dtype):
    torch, drv = _gpu()
    from emitter.families.conv import profile as cp
    from emitter.families.conv.problem import ConvProblem

    label, op, c, hw, k, rs, pad = layer
    cop = cp.ConvOp(op=op, dims=2, a=dtype, c=dtype, accumulator="f32", activation="identity", bias=False)
    prob = cp.profile_problem(ConvProblem(n=32, h=hw, w=hw, c=c, k=k, r=rs, s=rs,
                                          pad_front=(0, pad, pad), pad_back=(0, pad, pad)))
    data = cp.profile_allocate(cop, prob, SimpleNamespace(alpha=1.0, beta=0.0), sets=2)
    try:
        stream = drv.Stream()
        base = cp.baseline("cudnn", data, stream)
        assert "convolution_backward" in base.provider, base.provider
        views = [cp._views(torch, data, i) for i in range(2)]
        for v in views:   # the tensors a model passes: channels_last 4-D views
            for t in ("x", "w", "y"):
                assert v[t].is_contiguous(memory_format=torch.channels_last) and 0 not in v[t].stride()
        geo = dict(stride=[1, 1], padding=[pad, pad], dilation=[1, 1])
        mask = [op == "dgrad", op == "wgrad", False]

        def direct(i):
            v = views[i % 2]
            return torch.ops.aten.convolution_backward(v["y"], v["x"], v["w"], None, geo["stride"], geo["padding"],
                                                       geo["dilation"], False, [0, 0], 1, mask)

        def nn_grad(i):
            v = views[i % 2]
            if op == "dgrad":
                return torch.nn.grad.conv2d_input(tuple(v["x"].shape), v["w"], v["y"], padding=pad)
            return torch.nn.grad.conv2d_weight(v["x"], tuple(v["w"].shape), v["y"], padding=pad)

        def profiler(i):
            base.launch(i)

        # the profiler's launch runs on its own (external) stream: time everything on that stream
        with torch.cuda.stream(base.torch_stream):
            t = _median_ms(torch, {"profiler": profiler, "direct": direct, "nn_grad": nn_grad})
            t2 = _median_ms(torch, {"direct": direct, "profiler": profiler})          # the other order too
        prof = min(t["profiler"], t2["profiler"])
        dire = min(t["direct"], t2["direct"])
        print(f"{label} {dtype}: profiler baseline {prof * 1e3:.1f} us, aten.convolution_backward {dire * 1e3:.1f} us, "
              f"torch.nn.grad helper {t['nn_grad'] * 1e3:.1f} us ({t['nn_grad'] / dire:.2f}x)")
        assert prof <= 1.10 * dire, (f"{label} {dtype}: the profiler's cuDNN baseline takes {prof:.4f} ms, "
                                     f"{prof / dire:.2f}x what autograd's aten.convolution_backward takes ({dire:.4f} ms)")
        # and the outputs agree (the same cuDNN call on the same tensors)
        cp.profile_poison(data, 0)
        base.launch(0)
        stream.synchronize()
        got = data.cache["baseline_out"][1].float()
        want = direct(0)[0 if op == "dgrad" else 1].float()
        torch.cuda.synchronize()
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-2)
    finally:
        data.free()
