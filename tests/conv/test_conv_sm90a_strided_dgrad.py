"""sm90a strided dgrad (issue 38) without a GPU: the stride-phase decomposition (each phase a unit-stride dgrad of
the filter view w[r0::s] onto the dx view dx[a::s]) checked in numpy against a direct float64 dgrad on random shapes,
the spec rules, the rendered levels, the fake backend (which computes through the same phase plan, so a wrong plan
fails here), and ONE real nvcc compile whose shim then answers can-implement for strided problems."""

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from emitter.emit import spec_entries
from emitter.families.base import Rejection
from emitter.families.conv import instance_name, render_instance, resolve
from emitter.families.conv.config import ConvConfig
from emitter.families.conv.fake import fake_conv, phased_dgrad
from emitter.families.conv.model import StrideSupport
from emitter.families.conv.problem import ConvProblem, default_problems, not_supported_reasons
from emitter.families.conv.sm90a import STRIDED_DGRAD_MAX_PHASES, dgrad_phase_plan
from emitter.families.conv.spec import expand_entry
from emitter.render import banner
from emitter.spec.loader import parse_text

STRIDED = "family: conv\narch: sm90a\nop: dgrad\ndtype: f16\ntile: 128x128x64\ncluster: 1x1x1\nstride_support: strided\n"


def one(text: str):
    doc = parse_text(textwrap.dedent(text), "t.yaml")
    ((path, entry, kp),) = list(spec_entries(doc))
    ((cand, _),) = list(expand_entry(doc, path, entry, kp))
    return resolve(cand)


def cfg_of(text: str) -> dict:
    inst = one(text)
    return ConvConfig.from_entry({"name": instance_name(inst), "config": inst.config()}).cfg


# ------------------------------------------------------------------------------------------------ the phase math
def direct_dgrad(dy: np.ndarray, w: np.ndarray, xshape: tuple, pad: tuple, stride: tuple) -> np.ndarray:
    """float64 dgrad by its definition: every (output position, tap) pair scatters dy . w into the input row it read
    (N D H W C layouts, dilation 1)."""
    dx = np.zeros(xshape)
    _, D, H, W, _ = xshape
    _, Z, P, Q, _ = dy.shape
    _, T, R, S, _ = w.shape
    for z in range(Z):
        for p in range(P):
            for q in range(Q):
                for t in range(T):
                    for r in range(R):
                        for s in range(S):
                            i = (z * stride[0] - pad[0] + t, p * stride[1] - pad[1] + r, q * stride[2] - pad[2] + s)
                            if 0 <= i[0] < D and 0 <= i[1] < H and 0 <= i[2] < W:
                                dx[:, i[0], i[1], i[2], :] += dy[:, z, p, q, :] @ w[:, t, r, s, :]
    return dx


def phased(dy: np.ndarray, w: np.ndarray, p: ConvProblem) -> np.ndarray:
    """The same dgrad through dgrad_phase_plan: per phase a UNIT-stride direct dgrad of the filter view onto the dx
    view, whose own output-size formula must give dy's extent exactly (dy is passed whole)."""
    dx = np.full(p.shape("x"), np.nan)      # every element must be written: by a phase or as a zero-tap 0
    st = p.stride
    for ph in dgrad_phase_plan(p):
        a, T, tc = ph["a"], ph["extent"], ph["conv"]
        view = dx[:, a[0]::st[0], a[1]::st[1], a[2]::st[2]]
        assert view.shape[1:4] == T
        view[...] = 0.0
        if not ph["runs"]:
            continue
        assert min(ph["pad_back"]) >= 0 and min(ph["pad"]) >= 0
        wv = w[:, ph["r0"][0]::st[0], ph["r0"][1]::st[1], ph["r0"][2]::st[2]]
        assert wv.shape[1:4] == ph["taps"]
        q = replace(p, d=tc[0], h=tc[1], w=tc[2], t=wv.shape[1], r=wv.shape[2], s=wv.shape[3],
                    pad_front=ph["pad"], pad_back=ph["pad_back"], stride=(1, 1, 1))
        assert q.output_extents() == dy.shape[1:4], (p, ph)
        view[:, :tc[0], :tc[1], :tc[2]] = direct_dgrad(dy, wv, q.shape("x"), q.pad_front, (1, 1, 1))
    assert not np.isnan(dx).any()
    return dx


def random_problems(rng: np.random.Generator, count: int, dims: int = 2):
    out = []
    while len(out) < count:
        r, s = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        sh, sw = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        h, w = int(rng.integers(r, 14)) | 1, int(rng.integers(s, 14)) | 1          # odd H, W
        pf = (0, int(rng.integers(0, r)), int(rng.integers(0, s)))
        pb = (0, int(rng.integers(0, r)), int(rng.integers(0, s)))
        kw = {}
        if dims == 3:
            t = int(rng.integers(1, 4))
            kw = dict(d=int(rng.integers(t, 8)) | 1, t=t)
            pf, pb = (int(rng.integers(0, t)),) + pf[1:], (int(rng.integers(0, t)),) + pb[1:]
        p = ConvProblem(n=2, h=h, w=w, c=3, k=2, r=r, s=s, pad_front=pf, pad_back=pb,
                        stride=(int(rng.integers(1, 3)) if dims == 3 else 1, sh, sw), **kw)
        if min(p.output_extents()) >= 1:
            out.append(p)
    return out


@pytest.mark.parametrize("dims", [2, 3])
def test_phase_decomposition_equals_direct_dgrad_on_random_shapes(dims):
    rng = np.random.default_rng(38 + dims)
    for p in random_problems(rng, 60 if dims == 2 else 12, dims):
        dy = rng.standard_normal(p.shape("y"))
        w = rng.standard_normal(p.shape("w"))
        want = direct_dgrad(dy, w, p.shape("x"), p.pad_front, p.stride)
        np.testing.assert_allclose(phased(dy, w, p), want, atol=1e-9, err_msg=str(p))


def test_the_plan_covers_the_hard_cases():
    # a 1x1 filter at stride 2: three of four phases have no tap (dx is beta * source there)
    plan = dgrad_phase_plan(ConvProblem(n=1, h=13, w=11, c=8, k=8, r=1, s=1, stride=(1, 2, 2)))
    assert [ph["runs"] for ph in plan] == [True, False, False, False]
    # H=6, R=3, s=2, no padding: phase 1's last dx row reads dy row 2 of 2 -- its unit-stride problem stops a row
    # short (T + c - M + 1 = 3 > P = 2: dy is never read past its end) and that row is a zero-tap box
    p = ConvProblem(n=1, h=6, w=6, c=8, k=8, r=3, s=3, stride=(1, 2, 2))
    ph = [x for x in dgrad_phase_plan(p) if x["a"] == (0, 1, 1)][0]
    assert ph["extent"][1:] == (3, 3) and ph["conv"][1:] == (2, 2) and ph["taps"][1:] == (1, 1)
    assert p.output_extents()[1:] == (2, 2)


# ------------------------------------------------------------------------------------------------ the fake backend
def test_fake_backend_computes_strided_dgrad_through_the_phases():
    rng = np.random.default_rng(7)
    for p in random_problems(rng, 8):
        y = rng.standard_normal(p.shape("y"))
        w = rng.standard_normal(p.shape("w"))
        np.testing.assert_allclose(phased_dgrad(p, w, y), fake_conv("dgrad", p, None, w, y), atol=1e-9)


def test_a_wrong_phase_plan_fails_the_fake_backend(monkeypatch):
    from emitter.families.conv import sm90a

    good = sm90a._dgrad_phase_dim

    def off_by_one(extent, taps, stride, pad, out, a):     # a phase's front padding one too small
        r0, m, c, t, tc, pb = good(extent, taps, stride, pad, out, a)
        return (r0, m, c - 1, t, tc, pb + 1) if c > 0 else (r0, m, c, t, tc, pb)

    monkeypatch.setattr(sm90a, "_dgrad_phase_dim", off_by_one)
    p = ConvProblem(n=2, h=13, w=11, c=8, k=8, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 2, 2))
    rng = np.random.default_rng(1)
    y, w = rng.standard_normal(p.shape("y")), rng.standard_normal(p.shape("w"))
    with pytest.raises(AssertionError):     # the phase's dy extent no longer matches, or the values differ
        np.testing.assert_allclose(phased_dgrad(p, w, y), fake_conv("dgrad", p, None, w, y), atol=1e-6)


def test_emitter_verify_fake_backend_runs_strided_problems_and_catches_a_planted_fault(tmp_path):
    (tmp_path / "spec.yaml").write_text("kernels:\n  - " + STRIDED.replace("\n", "\n    ").rstrip() + "\n")
    run = [sys.executable, "-m", "emitter"]
    out = tmp_path / "gen"
    r = subprocess.run(run + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["verify", str(out), "--backend", "fake"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    assert res["summary"]["cases"]["FAILED"] == 0 and res["summary"]["cases"]["PASSED"] >= 8, res["summary"]
    passed = [x["problem"] for x in res["results"] if x["status"] == "PASSED"]
    assert any("str1x3x3" in x for x in passed) and any("r1s1" in x and "str1x2x2" in x for x in passed), passed
    for fault in ("conv_stride_ignored", "conv_wrong_padding", "conv_row_short"):
        faults = json.dumps([{"kind": fault, "select": "*"}])
        r = subprocess.run(run + ["verify", str(out), "--backend", "fake", "--quick", "--fake-faults", faults],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 1, (fault, r.stdout[-2000:])


# ------------------------------------------------------------------------------------------------ rules, rendering
def test_sm90a_strided_dgrad_resolves_with_its_own_name():
    inst = one(STRIDED)
    assert not isinstance(inst, Rejection), inst
    assert inst.stride_support is StrideSupport.strided
    assert "_strided_al8x8x8_" in instance_name(inst)
    unity = one(STRIDED.replace("stride_support: strided\n", ""))
    assert "_unity_al8x8x8_" in instance_name(unity)


@pytest.mark.parametrize("extra,rule,fix", [
    ("epilogue: {activation: relu}\n", "dgrad-strided-activation", "remove the activation"),
    ("split_k: parallel\n", "dgrad-strided-split-k", "remove split_k"),
])
def test_strided_rejections_name_rule_and_fix(extra, rule, fix):
    r = one(STRIDED + extra)
    assert isinstance(r, Rejection) and r.rule == rule and fix in r.reason, r


def test_strided_dgrad_dtype_rule():
    r = one(STRIDED.replace("dtype: f16", "dtype: {a: f32, c: f32, accumulator: f32}"))
    assert isinstance(r, Rejection) and r.rule == "dgrad-strided-dtype" and "sm80" in r.reason


def test_render_runs_the_unit_kernel_per_phase_and_keeps_unity_text():
    inst = one(STRIDED)
    name = instance_name(inst)
    src = render_instance(inst, name, banner("t.yaml", "0" * 64))
    assert "struct StridedDgradKernel" in src and "using ConvKernel = StridedDgradKernel;" in src
    assert "using UnitKernel = cutlass::conv::kernel::ConvUniversal<ProblemShape" in src
    assert "namespace unit {" in src and f"constexpr int kMaxPhases = {STRIDED_DGRAD_MAX_PHASES};" in src
    assert "unit::Device::arguments(&q, args.phase[args.phases])" in src
    assert "return EMITTER_CANNOT_IMPLEMENT;   // stride_support: unity" not in src
    plain = one(STRIDED.replace("stride_support: strided\n", ""))
    psrc = render_instance(plain, instance_name(plain), banner("t.yaml", "0" * 64))
    assert "StridedDgradKernel" not in psrc and "using ConvKernel = cutlass::conv::kernel::ConvUniversal" in psrc


def test_problems_and_reasons():
    cfg = cfg_of(STRIDED)
    probs = [p for p, kind in default_problems(cfg) if kind == "normal"]
    assert any(p.stride[1] == 3 for p in probs) and any(p.r == 1 and p.stride[1] == 2 for p in probs)
    assert any(p.beta != 0 and max(p.stride) > 1 for p in probs)
    dil = ConvProblem(n=2, h=13, w=11, c=40, k=72, r=3, s=3, stride=(1, 2, 2), dilation=(1, 2, 2))
    assert any("dilation" in r for r in not_supported_reasons(cfg, dil))
    many = ConvProblem(n=2, h=13, w=11, c=40, k=72, r=3, s=3, stride=(1, 4, 3))
    assert any("stride phases" in r for r in not_supported_reasons(cfg, many))
    ok = ConvProblem(n=2, h=13, w=11, c=40, k=72, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1), stride=(1, 3, 3))
    assert not not_supported_reasons(cfg, ok)


# ------------------------------------------------------------------------------------------------ one nvcc compile
@pytest.mark.nvcc
def test_strided_instance_builds_and_its_shim_plans_the_phases(tmp_path):
    from emitter.families.conv.abi import ConvShim, c_problem_from
    from emitter.kit.shim import EMITTER_CANNOT_IMPLEMENT, EMITTER_CUDA_ERROR, EMITTER_OK

    (tmp_path / "spec.yaml").write_text("kernels:\n  - " + STRIDED.replace("\n", "\n    ").rstrip() + "\n")
    out = tmp_path / "gen"
    run = [sys.executable, "-m", "emitter"]
    r = subprocess.run(run + ["emit", str(tmp_path / "spec.yaml"), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(run + ["build", str(out), "-j", "2", "--cache-dir", str(tmp_path / "cache"), "--no-progress"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (entry,) = json.loads((out / "manifest.json").read_text())["instances"]
    name = entry["name"]
    rec = json.loads((out / "build" / name / "record.json").read_text())
    assert rec["status"] in ("ok", "cached"), rec.get("error")
    assert rec["resources"]["spill_bytes"] == 0
    shim = ConvShim(out / rec["artifacts"]["host"], name)
    ptrs = {"x": 1 << 20, "w": 1 << 21, "y": 1 << 22}
    layer = ConvProblem(n=64, h=56, w=56, c=128, k=128, r=3, s=3, pad_front=(0, 1, 1), pad_back=(0, 1, 1),
                        stride=(1, 2, 2))
    status, q = shim.query(c_problem_from(layer, ptrs))
    # no GPU here: the shim plans and checks the phases, then asks the device for its SM count
    assert status in (EMITTER_OK, EMITTER_CUDA_ERROR), status
    if status == EMITTER_OK:
        assert q.params_bytes > 4096 and q.params_bytes <= 32764
    refused = [
        replace(layer, dilation=(1, 2, 2), pad_front=(0, 2, 2), pad_back=(0, 2, 2)),   # dilation with stride
        replace(layer, stride=(1, 4, 3)),                                             # 12 phases
        replace(layer, c=132),                                                        # rows not 16 bytes
    ]
    for bad in refused:
        status, _ = shim.query(c_problem_from(bad, ptrs))
        assert status == EMITTER_CANNOT_IMPLEMENT, bad
