"""On the GPU: the conv profiler's cuDNN baseline is as fast as what autograd runs.

`emitter profile`'s conv baseline (emitter.families.conv.profile.baseline, which calls
emitter.families.conv.baseline.torch_conv) is timed against `torch.ops.aten.convolution_backward` called directly
on the same channels_last tensors (what a training step runs); the test fails if the profiler's baseline is more
than 10% slower on any layer. It also times torch.nn.grad's helpers (the stand-in baseline of tables before
2026-11-27) to show the check tells a slow baseline apart: on the 1x1 dgrad layer they were 13x slower.
"""

from __future__ import annotations

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


RATIOS: dict = {}


def _gpu():
    pytest.importorskip("pycuda")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as drv
    return torch, drv


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layer", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_profiler_baseline_is_what_autograd_runs(layer, dtype):
    torch, drv = _gpu()
    from emitter.families.conv import profile as cp
    from emitter.families.conv.problem import ConvProblem
    from emitter.profile.config import Timing
    from emitter.profile.timing import EventTimer

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

        def timed_direct(i):
            with torch.cuda.stream(base.torch_stream):
                direct(i)

        def timed_nn_grad(i):
            with torch.cuda.stream(base.torch_stream):
                nn_grad(i)

        # the profiler's own timer: each launch between its own event pair behind the blocking kernel, the
        # functions alternated launch by launch (GPU time, not the host's enqueue cost)
        timer = EventTimer(stream, Timing(warmup=10, iterations=50, repeats=3))
        prof_s, dire_s, old_s = timer.interleave([base.launch, timed_direct, timed_nn_grad], 2)
        prof, dire, old = prof_s.median_ms, dire_s.median_ms, old_s.median_ms
        print(f"{label} {dtype}: profiler baseline {prof * 1e3:.1f} us, aten.convolution_backward {dire * 1e3:.1f} us, "
              f"torch.nn.grad helper {old * 1e3:.1f} us ({old / dire:.2f}x)")
        assert prof <= 1.10 * dire, (f"{label} {dtype}: the profiler's cuDNN baseline takes {prof:.4f} ms, "
                                     f"{prof / dire:.2f}x what autograd's aten.convolution_backward takes ({dire:.4f} ms)")
        RATIOS[(label, dtype)] = old / dire
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


def test_the_check_tells_the_stand_in_baseline_apart():
    """The timing above is sharp enough to have caught the old baseline: torch.nn.grad's stand-in dgrad of the 1x1
    K256 layer is far over the 10% margin (it measured 13x on an H100)."""
    if not RATIOS:
        pytest.skip("the layer timings above did not run")
    worst = max(RATIOS.values())
    assert worst > 1.5, f"torch.nn.grad's helpers were within {worst:.2f}x of aten.convolution_backward: {RATIOS}"
