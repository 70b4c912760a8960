"""Conv planted faults caught for their own reason (emitter/families/conv/check.py): the fake backend's faulty
output (fake.py, its own arithmetic) fails, its wrong elements are where the fault puts them (border rows and
columns for the halo, the off-diagonal taps for a transposed filter gradient, everything but the first window
for an ignored stride, the last row for a short output) and it equals the fault model's output (reference.py's
convolution on transformed inputs); the check fails on single wrong elements that leave the norm within
tolerance; swapped_filter_axes refuses a non-square filter."""

from dataclasses import replace

import numpy as np
import pytest

from emitter.families.conv import check, fake, reference
from emitter.families.conv import runtime as hooks
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.problem import ConvProblem
from emitter.runtime.fake_backend import FakeFaultError

PROBLEMS = {
    "stride2_pad1": ConvProblem(n=2, h=15, w=13, c=6, k=10, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                                stride=(1, 2, 2)),
    "stride1_pad1": ConvProblem(n=2, h=9, w=11, c=5, k=7, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),
    "pad2_dil2": ConvProblem(n=2, h=12, w=10, c=4, k=6, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2),
                             dilation=(1, 2, 2)),
    "asym_5x5": ConvProblem(n=3, h=11, w=12, c=3, k=5, r=5, s=5, pad_front=(0, 2, 1), pad_back=(0, 1, 2),
                            stride=(1, 2, 1)),
}


def _cfg(op, **kw):
    config = {"arch": "sm80", "op": op, "dims": 2, "a": "f16", "c": "f16", "accumulator": "f32",
              "alignment_a": 1, "alignment_b": 1, "alignment_c": 1, "tile": [128, 128, 64], "iterator": "analytic",
              "stride_support": "strided", "split_k": "none", "epilogue": {"activation": "identity", "bias": False}}
    config.update(kw)
    return ConvConfig.from_entry({"name": f"t_{op}", "family": "conv", "config": config})


def _faulty(op, p, fault, seed=5):
    # a strided dgrad kernel refuses dilated filters (CUTLASS's can_implement): stride-1 dgrad runs on a unity one
    cfg = _cfg(op, **({"stride_support": "unity"} if op == "dgrad" and p.stride == (1, 1, 1) else {}))
    inputs = hooks.make_inputs(cfg, p, "normal", seed)
    out = hooks.fake_run(cfg, p, inputs.buffers, {f"conv_{fault}": {}})
    verdict = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
    model = None
    if fault != "row_short":
        model = hooks.compare(cfg, p, inputs, out, check.fault_model_reference(fault, cfg.cfg, p, inputs.values))
    return verdict, model


CASES = [(fault, op, name) for fault in check.FAULTS for op in ("fprop", "dgrad", "wgrad") for name in sorted(PROBLEMS)
         if not (fault == "stride_ignored" and PROBLEMS[name].stride == (1, 1, 1))]   # unit stride: nothing to ignore


@pytest.mark.parametrize("fault,op,name", CASES)
def test_fault_shows_its_own_mark_and_equals_the_fault_model(fault, op, name):
    p = PROBLEMS[name]
    verdict, model = _faulty(op, p, fault)
    assert verdict["status"] == "FAILED", verdict
    assert check.signature_misses(fault, op, p, verdict, model) == [], (verdict["reason"], verdict.get("bad_map"))
    if model is not None:                              # the fake's own arithmetic of the fault = the fault model
        assert model["status"] == "PASSED" and model["mismatches"] == 0, model["reason"]


@pytest.mark.parametrize("op", ["fprop", "dgrad"])
def test_wrong_padding_leaves_the_interior_right(op):
    p = PROBLEMS["stride1_pad1"]
    verdict, _ = _faulty(op, p, "wrong_padding")
    bad = np.asarray(verdict["bad_map"])
    rows, cols = check.padding_reach(op, p)
    assert rows and cols and rows < set(range(bad.shape[0])) and cols < set(range(bad.shape[1]))
    inner = np.ix_([i for i in range(bad.shape[0]) if i not in rows], [j for j in range(bad.shape[1]) if j not in cols])
    assert bad[inner].sum() == 0 and bad.sum() > 0
    # the wrong elements reach the last row and column (the first image reads zeros before the buffer)
    assert bad[-1].any() and bad[:, -1].any()


def test_wrong_padding_in_wgrad_spares_the_taps_that_never_see_padding():
    p = PROBLEMS["stride2_pad1"]
    verdict, _ = _faulty("wgrad", p, "wrong_padding")
    bad = np.asarray(verdict["bad_map"])
    assert bad[1, 1] == 0 and bad[0, 0] > 0 and bad[2, 2] > 0          # the centre tap stays inside the image


def test_swapped_filter_gradient_is_wrong_exactly_off_the_diagonal():
    verdict, _ = _faulty("wgrad", PROBLEMS["stride1_pad1"], "swapped_filter_axes")
    bad = np.asarray(verdict["bad_map"])
    assert (np.diag(bad) == 0).all() and (bad + np.eye(3, dtype=int) > 0).all()


def test_ignored_stride_is_right_only_where_both_windows_start():
    p = PROBLEMS["stride2_pad1"]
    verdict, _ = _faulty("fprop", p, "stride_ignored")
    bad = np.asarray(verdict["bad_map"])
    assert bad[0, 0] == 0 and (bad.reshape(-1)[1:] > 0).all()
    verdict, _ = _faulty("dgrad", p, "stride_ignored")
    reach = (p.output_extents()[1] - 1) - 1 + 2                          # the last row a stride-1 dy reaches
    assert set(range(reach + 1, p.h)) <= set(verdict["bad_rows"])


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
def test_short_output_is_unwritten_exactly_in_its_last_row(op):
    p = PROBLEMS["asym_5x5"]
    verdict, _ = _faulty(op, p, "row_short")
    assert verdict["mismatches"] == 0 and "never written" in verdict["reason"]
    if op == "wgrad":
        assert verdict["unwritten_outer"] == [p.k - 1] and verdict["unwritten"] == p.t * p.r * p.s * p.c
    else:
        last = (p.output_extents()[1] if op == "fprop" else p.h) - 1
        assert verdict["unwritten_rows"] == [last]


def test_a_signature_check_can_fail():
    """A fault's mark is specific: the halo signature refuses a stride fault, the stride one a halo fault."""
    p = PROBLEMS["stride2_pad1"]
    stride, stride_model = _faulty("fprop", p, "stride_ignored")
    assert check.signature_misses("wrong_padding", "fprop", p, stride) != []
    halo, _ = _faulty("fprop", p, "wrong_padding")
    assert check.signature_misses("stride_ignored", "fprop", p, halo) != []
    assert check.signature_misses("row_short", "fprop", p, halo) != []
    assert check.signature_misses("stride_ignored", "fprop", p, stride, stride_model) == []
    swapped, _ = _faulty("wgrad", p, "swapped_filter_axes")
    assert check.signature_misses("swapped_filter_axes", "wgrad", p, _faulty("wgrad", p, "wrong_padding")[0]) != []
    assert check.signature_misses("swapped_filter_axes", "wgrad", p, swapped) == []


def test_element_wise_mismatches_fail_a_case_the_norm_lets_pass():
    """Ten wrong elements in one border row of a 64x64 image: the relative Frobenius error stays within the
    tolerance, the element-wise count does not; a clean output's rounding noise passes."""
    rng = np.random.default_rng(0)
    want = rng.standard_normal((2, 1, 64, 64, 16))
    tol = reference.tolerance("f16", 576)
    rms = float(np.sqrt(np.mean(want ** 2)))
    noisy = want + rng.standard_normal(want.shape) * 0.5 * tol * rms
    clean = reference.compare(noisy, want, np.zeros(want.shape, bool), tol)
    assert clean["status"] == "PASSED" and clean["mismatches"] == 0, clean["reason"]
    got = want.copy()
    got[1, 0, 63, :10, 3] += 20 * tol * rms
    v = reference.compare(got, want, np.zeros(want.shape, bool), tol)
    assert v["rel_err"] < tol
    assert v["status"] == "FAILED" and v["mismatches"] == 10 and "elements off" in v["reason"]
    assert v["bad_rows"] == [63] and v["bad_cols"] == list(range(10)) and v["bad_outer"] == [1]


def test_swapped_filter_axes_refuses_a_non_square_filter():
    p = ConvProblem(n=1, h=8, w=9, c=4, k=4, r=3, s=1, pad_front=(0, 1, 0), pad_back=(0, 1, 0))
    cfg = _cfg("fprop")
    inputs = hooks.make_inputs(cfg, p, "normal", 1)
    with pytest.raises(FakeFaultError, match="square filter"):
        hooks.fake_run(cfg, p, inputs.buffers, {"conv_swapped_filter_axes": {}})
    with pytest.raises(FakeFaultError, match="square filter"):
        fake.fake_conv("wgrad", p, inputs.values["x"], None, inputs.values["y"], {"conv_swapped_filter_axes": {}})
    with pytest.raises(ValueError, match="square filter"):
        check.fault_model_reference("swapped_filter_axes", cfg.cfg, p, inputs.values)
    square = replace(p, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1))
    assert _faulty("fprop", square, "swapped_filter_axes")[0]["status"] == "FAILED"


def test_verify_fake_backend_reports_a_non_square_swap_as_an_error(tmp_path):
    """Through `emitter verify --backend fake`: the case errors with the reason, it is not counted as caught."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "-m", "emitter", "emit", str(root / "configs" / "conv" / "sm80_resnet50.yaml"),
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    faults = json.dumps([{"kind": "conv_swapped_filter_axes"}])
    r = subprocess.run([sys.executable, "-m", "emitter", "verify", str(out), "--backend", "fake", "--data", "normal",
                        "--select", "*fprop*128x128x64*", "--problem", "n=1,h=8,w=9,c=64,k=64,r=3,s=1,pad_h=1",
                        "--fake-faults", faults], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    reasons = [x["reason"] for x in res["results"] if x["status"] == "FAILED"]
    assert reasons and all("square filter" in why for why in reasons), reasons
