"""Conv runner bookkeeping (emitter.families.conv.runner.run_case) without a GPU: a stand-in kernel that computes
through the fake backend on torch CPU tensors, so the planted-bug launches (shifted padding, swapped filter axes,
stride ignored, a short output) and the copies around them are checked where CI has torch; skipped without it."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from emitter.families.conv import runtime as hooks  # noqa: E402
from emitter.families.conv.config import ConvConfig  # noqa: E402
from emitter.families.conv.runner import (  # noqa: E402
    PLANTED, _wgrad_swapped, expected_reason, planted_line, planted_problem, run_case,
)
from emitter.kit import hostdata  # noqa: E402


class StandIn:
    """What ConvKernel offers run_case, computing with the fake backend (a correct 'kernel')."""

    device = "cpu"

    def __init__(self, cfg: ConvConfig) -> None:
        self.torch = torch
        self.cfg = cfg
        self.name = cfg.name

    def run(self, p, tensors):
        """Read each buffer as a packed tensor of the launch's own geometry (as a kernel does), write the output."""
        bufs = {}
        for k, t in tensors.items():
            if t is None:
                bufs[k] = None
                continue
            flat = (t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()).reshape(-1)
            shape = (p.k,) if k == "bias" else p.shape({"source": self.cfg.op and {"fprop": "y", "dgrad": "x",
                                                                                    "wgrad": "w"}[self.cfg.op]}.get(k, k))
            n = int(np.prod(shape))
            assert flat.size >= n, (k, flat.size, shape)       # a kernel would read out of bounds
            bufs[k] = flat[:n].reshape(shape)
        out = hooks.fake_run(self.cfg, p, bufs, {})
        name, val = next(iter(out.items()))
        dst = tensors[name].reshape(-1)
        src = torch.from_numpy((val.view(np.int16) if val.dtype == np.uint16 else val).reshape(-1))
        assert dst.numel() >= src.numel()
        (dst.view(torch.int16) if dst.dtype == torch.bfloat16 else dst)[:src.numel()].copy_(src)
        return {"grid": [1, 1, 1]}


def cfg(op, dtype="f16", arch="sm90a", stride_support="strided"):
    return ConvConfig.from_entry({"name": f"standin_{op}_{dtype}", "family": "conv", "config": {
        "arch": arch, "op": op, "dims": 2, "a": dtype, "c": dtype, "accumulator": "f32", "alignment_a": 8,
        "alignment_b": 8, "alignment_c": 8, "tile": [128, 128, 64], "iterator": "optimized",
        "stride_support": stride_support, "split_k": "none", "epilogue": {"activation": "identity", "bias": False}}})


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_clean_cases_pass_and_planted_bugs_are_caught(op, dtype):
    k = StandIn(cfg(op, dtype))
    for i, (p, data) in enumerate(hooks.default_problems(k.cfg, quick=True)):
        v = run_case(k, p, data, i)
        assert v["status"] == "PASSED", (p.label(data), v["reason"])
    p = planted_problem(k.cfg)
    for bug in PLANTED:
        v = _wgrad_swapped(k, p, 3) if (bug == "swapped_filter_axes" and op == "wgrad") else run_case(k, p, "normal", 3, planted=bug)
        assert expected_reason(bug, v), (bug, v.get("status"), v.get("reason"), v.get("unwritten"))


@pytest.mark.parametrize("op,stride_support", [("fprop", "strided"), ("dgrad", "strided"), ("dgrad", "unity"),
                                               ("wgrad", "strided")])
def test_planted_bugs_show_where_they_go_wrong(op, stride_support):
    """The launches the GPU runner plants, run by the stand-in: each verdict carries its location and the fault
    model's comparison, and the halo bug leaves the interior right."""
    from emitter.families.conv.check import padding_reach

    k = StandIn(cfg(op, stride_support=stride_support))
    p = planted_problem(k.cfg)
    for bug in PLANTED:
        if bug == "stride_ignored" and p.stride == (1, 1, 1):
            continue                                  # a unity-stride instance: the runner skips it too
        v = _wgrad_swapped(k, p, 3) if (bug == "swapped_filter_axes" and op == "wgrad") else run_case(k, p, "normal", 3, planted=bug)
        assert v["signature_misses"] == [], (bug, v["signature_misses"])
        if bug != "row_short":
            assert v["fault_model"]["status"] == "PASSED", (bug, v["fault_model"])
        assert planted_line(k.name, bug, v, expected_reason(bug, v)).startswith("CAUGHT")
    halo = run_case(k, p, "normal", 4, planted="wrong_padding")
    missed = planted_line(k.name, "stride_ignored", {**halo, "signature_misses": ["x"]}, False)
    assert missed.startswith("MISSED") and missed.endswith("not its mark: x")
    bad = np.asarray(halo["bad_map"])
    rows, cols = padding_reach(op, p)
    assert bad.sum() > 0 and all(i in rows or j in cols for i, j in zip(*np.nonzero(bad)))


def test_planted_swap_refuses_a_non_square_filter():
    from dataclasses import replace

    k = StandIn(cfg("fprop"))
    p = replace(planted_problem(k.cfg), s=1, pad_front=(0, 1, 0), pad_back=(0, 1, 0))
    with pytest.raises(ValueError, match="square filter"):
        run_case(k, p, "normal", 1, planted="swapped_filter_axes")
    with pytest.raises(ValueError, match="square filter"):
        _wgrad_swapped(StandIn(cfg("wgrad")), p, 1)


def test_unity_stride_dgrad_has_no_stride_bug_to_plant():
    k = StandIn(cfg("dgrad", arch="sm80", stride_support="unity"))
    assert planted_problem(k.cfg).stride == (1, 1, 1)


def test_poison_is_what_an_unwritten_output_holds():
    k = StandIn(cfg("fprop"))
    p = planted_problem(k.cfg)
    v = run_case(k, p, "normal", 1, planted="row_short")
    z, pp, q = p.output_extents()
    assert v["unwritten"] == p.n * z * q * p.k          # exactly the last output row of every image
    assert hostdata.poison_value(k.cfg.c).dtype == np.float16
