"""Conv family (issue 28): the float64 reference against the fake backend's independent computation (and a
scalar loop), odd sizes, planted bugs caught for the right reason, problems, FLOPs, the C ABI mirror, and
`emitter verify --backend fake` on a conv manifest."""

import ctypes
import itertools
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emitter.errors import SpecError
from emitter.families.conv import check, fake, reference
from emitter.families.registry import runtime_family
from emitter.families.conv.abi import EmitterConvProblem
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.flops import conv_flops
from emitter.families.conv.problem import ConvProblem, not_supported_reasons, parse_problem, problem_from_mapping

ROOT = Path(__file__).resolve().parents[2]
hooks = runtime_family("conv")

ODD = [
    ConvProblem(n=2, h=9, w=11, c=5, k=7, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1)),           # C, K odd
    ConvProblem(n=1, h=13, w=10, c=3, k=4, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2)),
    ConvProblem(n=2, h=12, w=12, c=4, k=6, r=3, s=3, pad_front=(0, 2, 2), pad_back=(0, 2, 2), dilation=(1, 2, 2)),
    ConvProblem(n=3, h=7, w=9, c=6, k=5, r=1, s=1),                                                       # 1x1
    ConvProblem(n=1, h=17, w=15, c=3, k=4, r=7, s=7, pad_front=(0, 3, 3), pad_back=(0, 3, 3), stride=(1, 2, 2)),
    ConvProblem(n=2, h=10, w=9, c=3, k=5, r=3, s=2, pad_front=(0, 2, 0), pad_back=(0, 0, 1)),             # asymmetric
    ConvProblem(n=1, h=11, w=8, c=2, k=3, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 3, 2),
                dilation=(1, 2, 1)),
    ConvProblem(n=2, d=5, h=6, w=7, c=3, k=4, t=3, r=3, s=2, pad_front=(1, 1, 0), pad_back=(1, 0, 1),
                stride=(2, 1, 1)),                                                                         # 3D
]


def _values(p, seed=0):
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(p.shape(t)) for t in ("x", "w", "y")}


def _brute(op, p, x, w, y):
    """A third, scalar implementation straight from the definition (tiny problems only)."""
    Z, P, Q = p.output_extents()
    out = np.zeros(p.shape({"fprop": "y", "dgrad": "x", "wgrad": "w"}[op]))
    for n, z, pp, q, k, t, r, s, c in itertools.product(range(p.n), range(Z), range(P), range(Q), range(p.k),
                                                        range(p.t), range(p.r), range(p.s), range(p.c)):
        d = z * p.stride[0] - p.pad_front[0] + t * p.dilation[0]
        h = pp * p.stride[1] - p.pad_front[1] + r * p.dilation[1]
        ww = q * p.stride[2] - p.pad_front[2] + s * p.dilation[2]
        if not (0 <= d < p.d and 0 <= h < p.h and 0 <= ww < p.w):
            continue
        if op == "fprop":
            out[n, z, pp, q, k] += x[n, d, h, ww, c] * w[k, t, r, s, c]
        elif op == "dgrad":
            out[n, d, h, ww, c] += y[n, z, pp, q, k] * w[k, t, r, s, c]
        else:
            out[k, t, r, s, c] += y[n, z, pp, q, k] * x[n, d, h, ww, c]
    return out


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("i", range(len(ODD)))
def test_reference_matches_fake(op, i):
    p = ODD[i]
    v = _values(p, i)
    ref = reference.conv_numpy(op, p, v["x"], v["w"], v["y"])
    got = fake.fake_conv(op, p, v["x"], v["w"], v["y"])
    assert ref.shape == got.shape
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-11)
    assert np.abs(ref).max() > 0.1          # not a trivially empty result


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("i", [1, 5, 6])
def test_reference_matches_the_definition(op, i):
    p = replace(ODD[i], n=1, k=min(ODD[i].k, 3), c=min(ODD[i].c, 2))
    v = _values(p, 7)
    np.testing.assert_allclose(reference.conv_numpy(op, p, v["x"], v["w"], v["y"]), _brute(op, p, v["x"], v["w"], v["y"]),
                               rtol=1e-12, atol=1e-12)


def test_torch_reference_matches_numpy():
    torch = pytest.importorskip("torch")
    for p in ODD:
        v = _values(p, 3)
        t = {k: torch.as_tensor(a) for k, a in v.items()}
        for op in ("fprop", "dgrad", "wgrad"):
            np.testing.assert_allclose(reference.conv_torch(op, p, t["x"], t["w"], t["y"]).numpy(),
                                       reference.conv_numpy(op, p, v["x"], v["w"], v["y"]), rtol=1e-10, atol=1e-10)


def _cfg(op="fprop", **kw):
    config = {"arch": "sm80", "op": op, "dims": 2, "a": "f16", "c": "f16", "accumulator": "f32",
              "alignment_a": 1, "alignment_b": 1, "alignment_c": 1, "tile": [128, 128, 64], "iterator": "analytic",
              "stride_support": "strided", "split_k": "none", "epilogue": {"activation": "identity", "bias": False}}
    config.update(kw)
    return ConvConfig.from_entry({"name": f"t_{op}", "family": "conv", "config": config})


@pytest.mark.parametrize("op", ["fprop", "dgrad", "wgrad"])
# conv_group_offset needs a grouped problem: tests/conv/test_conv_grouped.py plants it
@pytest.mark.parametrize("fault", [None, *(f for f in fake.FAKE_FAULTS if f != "conv_group_offset")])
def test_planted_bugs_are_caught_for_the_right_reason(op, fault):
    cfg = _cfg(op)
    p = ConvProblem(n=2, h=11, w=9, c=6, k=10, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2),
                    beta=0.5)
    inputs = hooks.make_inputs(cfg, p, "normal", 11)
    faults = {} if fault is None else {fault: {}}
    out = hooks.fake_run(cfg, p, inputs.buffers, faults)
    v = hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))
    if fault is None:
        assert v["status"] == "PASSED", v
        assert v["rel_err"] < v["tol"] and v["unwritten"] == 0
        return
    assert v["status"] == "FAILED", (fault, v)
    if fault == "conv_row_short":
        assert v["unwritten"] > 0 and "never written" in v["reason"]
    else:
        assert v["unwritten"] == 0 and v["rel_err"] > 10 * v["tol"] and "relative error" in v["reason"]
    # where it went wrong is where the fault puts it (tests/conv/test_faults_conv.py has each fault's own checks)
    assert check.signature_misses(fault, op, p, v) == [], v.get("bad_map")


def test_epilogues_alpha_beta_activation():
    for act in ("relu", "silu", "sigmoid", "gelu", "clamp"):
        cfg = _cfg("fprop", epilogue={"activation": act, "bias": False, "clamp_min": -0.5, "clamp_max": 0.5})
        p = ConvProblem(n=1, h=6, w=5, c=4, k=8, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), alpha=0.7, beta=-0.3)
        inputs = hooks.make_inputs(cfg, p, "normal", 5)
        out = hooks.fake_run(cfg, p, inputs.buffers, {})
        assert hooks.compare(cfg, p, inputs, out, hooks.reference(cfg, p, inputs))["status"] == "PASSED", act


@pytest.mark.parametrize("c", ["s8", "s32"])
def test_int8_convolution_saturates_like_the_kernel(c):
    cfg = _cfg("fprop", a="s8", c=c, accumulator="s32", alignment_a=16, alignment_b=16, alignment_c=16)
    p = ConvProblem(n=2, h=7, w=6, c=64, k=16, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), alpha=4.0, beta=0.5)
    inputs = hooks.make_inputs(cfg, p, "normal", 3)
    ref = hooks.reference(cfg, p, inputs)
    out = hooks.fake_run(cfg, p, inputs.buffers, {})
    v = hooks.compare(cfg, p, inputs, out, ref)
    assert v["status"] == "PASSED", v
    if c == "s8":
        assert np.abs(ref).max() > 127          # the case saturates


def test_output_poisoned_and_inputs_never_zero():
    cfg = _cfg("dgrad")
    p = ODD[0]
    inputs = hooks.make_inputs(cfg, p, "int", 1)
    assert inputs.outputs == ("x",)
    assert np.isnan(inputs.buffers["x"].astype(np.float64)).all()
    assert np.count_nonzero(inputs.values["y"]) > 0.5 * inputs.values["y"].size


def test_parse_problem_and_errors():
    (d,) = parse_problem("n=128,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1")
    p = problem_from_mapping(d)
    assert p.output_extents() == (1, 56, 56)
    assert conv_flops(p) == 2 * 128 * 64 * 56 * 56 * 64 * 9
    assert p.gemm("fprop") == (128 * 56 * 56, 64, 576)
    p2 = problem_from_mapping(parse_problem("n=1,h=10,w=9,c=8,k=8,r=3,s=3,pad_top=2,pad_bottom=0,stride_w=2")[0])
    assert p2.pad_front == (0, 2, 0) and p2.pad_back == (0, 0, 0) and p2.stride == (1, 1, 2)
    assert hooks.problem_from_dict(hooks.problem_to_dict(p2)) == p2
    for bad, msg in (("n=1,h=2,w=2", "missing conv problem key 'c'"), ("n=1,h=3,w=3,c=8,k=8,r=5,s=5", "no output"),
                     ("n=1,h=3,w=3,c=8,k=8,q=2", "unknown or malformed"), ("128x56x56", "key=value"),
                     ("n=1,h=x,w=3,c=8,k=8", "needs a number")):
        with pytest.raises(SpecError) as info:
            problem_from_mapping(parse_problem(bad)[0])
        assert msg in info.value.render(), (bad, info.value.render())


def test_not_supported_reasons():
    cfg3 = _cfg("fprop", arch="sm90a", alignment_a=8, alignment_b=8, alignment_c=8, iterator="optimized").cfg
    p = ConvProblem(n=1, h=8, w=8, c=3, k=64, r=3, s=3)
    assert any("C=3" in r for r in not_supported_reasons(cfg3, p))
    assert not_supported_reasons(cfg3, replace(p, c=16)) == []
    assert any("padding above" in r for r in not_supported_reasons(cfg3, replace(p, c=16, pad_front=(0, 300, 1))))
    unity = _cfg("dgrad", stride_support="unity").cfg
    assert any("unity-stride" in r for r in not_supported_reasons(unity, replace(p, stride=(1, 2, 2))))
    assert any("depth" in r for r in not_supported_reasons(cfg3, replace(p, c=16, d=3, t=3)))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
def test_abi_struct_matches_the_header(tmp_path):
    fields = [f[0] for f in EmitterConvProblem._fields_]
    src = tmp_path / "abi.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "conv_abi.h"\nint main(void){\n'
                   'printf("%zu\\n", sizeof(emitter_conv_problem));\n'
                   + "".join(f'printf("%zu\\n", offsetof(emitter_conv_problem, {f}));\n' for f in fields) + "return 0;}\n")
    exe = tmp_path / "abi"
    subprocess.run(["gcc", "-I", str(ROOT / "templates" / "conv" / "common"), str(src), "-o", str(exe)], check=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert got[0] == ctypes.sizeof(EmitterConvProblem)
    assert got[1:] == [getattr(EmitterConvProblem, f).offset for f in fields]


def test_emitter_verify_fake_backend_on_a_conv_manifest(tmp_path):
    out = tmp_path / "gen"
    env_cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(env_cmd + ["emit", str(ROOT / "configs" / "conv" / "sm80_resnet50.yaml"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(env_cmd + ["verify", str(out), "--backend", "fake", "--quick", "--data", "normal",
                                  "--select", "*fprop*128x128x64*", "--select", "*fixch*", "--select", "*dgrad*",
                                  "--select", "*splitkserial*"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["cases"]["FAILED"] == 0
    # fprop 128x128x64, fixed channels, unity dgrad + strided dgrad f16 / bf16, serial split-K wgrad
    assert res["summary"]["cases"]["PASSED"] >= 10 and res["summary"]["total_instances"] == 6
    assert {r["status"] for r in res["results"]} == {"PASSED"}
    # a planted bug fails the run
    faults = json.dumps([{"kind": "conv_stride_ignored", "select": "*fprop*128x128x64*"}])
    r = subprocess.run(env_cmd + ["verify", str(out), "--backend", "fake", "--quick", "--data", "normal",
                                  "--select", "*fprop*128x128x64*", "--fake-faults", faults],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    failed = [x for x in res["results"] if x["status"] == "FAILED"]
    assert failed and all("relative error" in x["reason"] for x in failed)
