"""verify without a GPU: problems, reference, tolerances, runner (fault isolation), reports, CLI, the ctypes
ABI, and the PyCUDA backend's launch path against a mock driver and a C mock shim (cc)."""

from __future__ import annotations

import ctypes
import fnmatch
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from emitter.dtypes import DType
from emitter.errors import SpecError
from emitter.families.gemm.abi import EmitterGemmProblem
from emitter.families.gemm.config import GemmConfig
from emitter.families.gemm.inputs import int_plan, make_inputs
from emitter.families.gemm.layout import MatrixLayout
from emitter.families.gemm.problem import GemmProblem
from emitter.families.gemm.reference import apply_activation, compare, reference_gemm, tolerance
from emitter.kit.hostdata import bits_of, decode, encode, poison_value, quantize
from emitter.kit.shim import EmitterLaunch
from emitter.verify.problems import (
    VerifyProblem, cannot_run_reason, default_problems, load_problem_file, problems_from_options,
)
from emitter.verify.report import exit_code, instance_status, to_json, to_junit
from emitter.verify.runner import VerifyOptions, verify

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- helpers
def config(**kw):
    c = {"arch": "sm80", "a": "f16", "b": "f16", "c": "f16", "d": "f16", "layout_a": "row", "layout_b": "col",
         "layout_c": "row", "accumulator": "f32", "epilogue_compute": "f32", "op_class": "tensorop",
         "tile": [128, 128, 32], "warp": [64, 64, 32], "cluster": None, "instruction": [16, 8, 16], "stages": 3,
         "kernel_schedule": "auto", "epilogue_schedule": "auto", "tile_scheduler": "persistent", "swizzle": 1,
         "alignment_a": 8, "alignment_b": 8, "alignment_c": 8,
         "epilogue": {"activation": "identity", "bias": "none"}, "split_k": "none", "batched": False}
    c.update(kw)
    return c


def entry(name, **kw):
    return {"name": name, "family": "gemm", "arch": kw.get("arch", "sm80"), "source": f"{name}.cu", "spec": "t.yaml",
            "spec_hash": "0" * 64, "config": config(**kw)}


def write_manifest(root: Path, entries) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0.1.0",
                                                    "generated_at": None, "specs": [], "instances": list(entries),
                                                    "rejected": []}))
    return root


SMALL = [VerifyProblem(GemmProblem(72, 40, 24, alpha=1.0, beta=0.0), "int", source="user"),
         VerifyProblem(GemmProblem(136, 72, 64, alpha=1.25, beta=0.5), "normal", source="user")]


def run_fake(tmp_path, entries, faults=(), problems=SMALL, isolation=False, timeout=60.0, seed=7, **kw):
    root = write_manifest(tmp_path / "m", entries)
    opts = VerifyOptions(backend="fake", backend_options={"faults": list(faults)}, isolation=isolation,
                         launch_timeout_s=timeout, seed=seed, quick=True, **kw)
    return verify(root, entries, problems, opts)


def by_problem(run, instance=None):
    return {r["problem"]: r for r in run.results if instance is None or r["instance"] == instance}


# ---------------------------------------------------------------------------------------------- codecs
def test_bf16_and_fp8_codecs_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 0.0, 65504.0])
    b = encode(x, DType.bf16)
    assert decode(b, DType.bf16).tolist() == [1.0, 1.0, 1.015625, -2.5, 0.0, 65536.0]
    e = decode(encode(np.array([0.0, 1.0, 1.0625, 1.1875, 448.0, 1000.0, -3.0, 2 ** -9]), DType.e4m3), DType.e4m3)
    assert e.tolist() == [0.0, 1.0, 1.0, 1.25, 448.0, 448.0, -3.0, 2 ** -9]
    assert decode(encode(np.array([57344.0, 1.0e6, 1.125]), DType.e5m2), DType.e5m2).tolist() == [57344.0, 57344.0, 1.0]
    assert decode(encode(np.array([300.0, -300.0, 2.5]), DType.s8), DType.s8).tolist() == [127, -128, 2]
    assert quantize(np.array([1.0 + 2 ** -11]), DType.tf32).tolist() == [1.0]
    for dt in DType:
        assert np.isnan(decode(np.asarray(poison_value(dt)).reshape(1), dt)[0]) or not dt.is_float


def test_matrix_layout_index_with_padding_and_batch_stride():
    lay = MatrixLayout(rows=2, cols=3, row_major=False, ld=4, batch=2, batch_stride=20)
    idx = lay.index()
    assert idx[0, 1, 2] == 1 + 2 * 4 and idx[1, 0, 0] == 20
    assert lay.elements() == 20 + 2 * 4 + 2


# ---------------------------------------------------------------------------------------------- problems
def test_default_problems_respect_alignment_and_enable_modes():
    cfg = GemmConfig.from_entry(entry("x", layout_a="col", layout_b="row", layout_c="col", batched=True,
                                      split_k="serial"))
    probs = default_problems(cfg)
    assert all(cannot_run_reason(cfg, p.problem) is None for p in probs)
    sizes = {p.problem.m for p in probs}
    assert any(m % 128 for m in sizes)                     # non tile multiples
    assert any(p.problem.beta == 0 for p in probs) and any(p.problem.beta != 0 for p in probs)
    assert any(p.problem.batch > 1 for p in probs) and any(p.problem.split_k > 1 for p in probs)
    assert any(p.problem.lda for p in probs)                   # padded leading dimensions
    assert {p.data for p in probs} == {"int", "normal"}
    assert any(p.problem.m == 4096 for p in probs)
    # row-major A with row-major C: m is free of alignment, so m=1 is there
    cfg2 = GemmConfig.from_entry(entry("y"))
    assert any(p.problem.m == 1 for p in default_problems(cfg2, quick=True))
    assert not any(p.problem.batch > 1 or p.problem.split_k > 1 for p in default_problems(cfg2, quick=True))
    assert len({p.label for p in probs}) == len(probs)


def test_cannot_run_reason_names_the_rule():
    cfg = GemmConfig.from_entry(entry("x"))
    assert "k=129 is not a multiple of 8" in cannot_run_reason(cfg, GemmProblem(128, 128, 129))
    assert "not batched" in cannot_run_reason(cfg, GemmProblem(128, 128, 128, batch=2))
    assert "split-K" in cannot_run_reason(cfg, GemmProblem(128, 128, 128, split_k=2))
    assert "lda=96 is smaller" in cannot_run_reason(cfg, GemmProblem(128, 128, 128, lda=96))
    assert "lda=100 is not a multiple" in cannot_run_reason(cfg, GemmProblem(128, 128, 128, lda=100))


def test_user_problems_from_options_and_file(tmp_path):
    ps = problems_from_options("127,129", "64", "32", beta="0,0.5", data="normal")
    assert [(p.problem.m, p.problem.beta) for p in ps] == [(127, 0.0), (127, 0.5), (129, 0.0), (129, 0.5)]
    assert all(p.source == "user" for p in ps)
    with pytest.raises(SpecError, match="missing --k"):
        problems_from_options("1", "2", None)
    with pytest.raises(SpecError, match="integers"):
        problems_from_options("x", "2", "3")
    f = tmp_path / "p.yaml"
    f.write_text("problems:\n  - {m: 1000, n: 517, k: 129}\n  - {m: 64, n: 64, k: 64, beta: 0.5, data: int, lda: 72}\n")
    ps = load_problem_file(f)
    assert len(ps) == 3 and ps[-1].problem.lda == 72 and ps[-1].data == "int"
    f.write_text("problems:\n  - {m: 10, n: 10, k: 10}\n  - {m: 10, n: 10, kk: 10}\n")
    with pytest.raises(SpecError) as e:
        load_problem_file(f)
    assert e.value.line == 3 and "kk" in e.value.render()
    f.write_text("problems:\n  - {m: 10, n: -1, k: 10}\n")
    with pytest.raises(SpecError, match="out of range") as e:
        load_problem_file(f)
    assert e.value.line == 2
    f.write_text("problems:\n  - {m: 10, n: 10}\n")
    with pytest.raises(SpecError, match="lacks k"):
        load_problem_file(f)
    f.write_text("problems: [\n")
    with pytest.raises(SpecError, match="YAML"):
        load_problem_file(f)
    f.write_text("problem:\n  - {m: 1, n: 1, k: 1}\n")
    with pytest.raises(SpecError, match="problems"):
        load_problem_file(f)


# ---------------------------------------------------------------------------------------------- reference
def test_activations_match_cutlass_definitions():
    z = np.array([-3.0, -0.5, 0.0, 0.7, 4.0, np.nan])
    assert np.array_equal(apply_activation(z, "relu")[:5], [0, 0, 0, 0.7, 4.0]) and np.isnan(apply_activation(z, "relu")[5])
    g = apply_activation(z[:5], "gelu")
    want = [0.5 * x * (1 + math.erf(x / math.sqrt(2))) for x in z[:5]]
    assert np.allclose(g, want, rtol=1e-15, atol=1e-15)
    gt = apply_activation(z[:5], "gelu", gelu="tanh")
    assert np.allclose(gt, want, atol=2e-3) and not np.allclose(gt, want, atol=1e-6)
    assert np.allclose(apply_activation(z[:5], "silu"), z[:5] / (1 + np.exp(-z[:5])))
    assert np.allclose(apply_activation(z[:5], "sigmoid"), 1 / (1 + np.exp(-z[:5])))
    assert apply_activation(z[:5], "clamp", -1.0, 2.0).tolist() == [-1.0, -0.5, 0.0, 0.7, 2.0]


def test_reference_epilogue_bias_alpha_beta_and_int8_saturation():
    cfg = GemmConfig.from_entry(entry("x", a="s8", b="s8", c="s8", d="s8", accumulator="s32",
                                      epilogue={"activation": "identity", "bias": "column"}))
    A = np.array([[[10.0, 20.0]]])          # 1x1x2
    B = np.array([[[3.0, 1.0], [4.0, -9.0]]])  # 1x2x2
    C = np.array([[[1.0, 2.0]]])
    bias = np.array([0.5, 100.0])
    ref = reference_gemm(cfg, 1.0, 2.0, A, B, C, bias)
    # [110 + 2 + 0.5, -170 + 4 + 100] -> round half even, saturate
    assert ref.tolist() == [[[112.0, -66.0]]]
    ref = reference_gemm(cfg, 2.0, 0.0, A, B, C, bias)
    assert ref.tolist() == [[[127.0, -128.0]]]
    cfg_row = GemmConfig.from_entry(entry("y", a="f32", b="f32", c="f32", d="f32",
                                          epilogue={"activation": "relu", "bias": "row"}))
    ref = reference_gemm(cfg_row, 1.0, 0.0, A, B, None, np.array([-1000.0]))
    assert ref.tolist() == [[[0.0, 0.0]]]


def test_tolerances_per_dtype():
    t = lambda **kw: tolerance(GemmConfig.from_entry(entry("x", **kw)))  # noqa: E731
    assert t(a="f32", b="f32", c="f32", d="f32", op_class="simt") == 1e-5
    assert t(a="f32", b="f32", c="f32", d="f32") == 5e-3          # tensor cores: tf32
    assert t(a="tf32", b="tf32", c="f32", d="f32") == 5e-3
    assert t() == 1e-2 and t(a="bf16", b="bf16", c="bf16", d="bf16") == 1e-2
    assert t(a="e4m3", b="e4m3", c="bf16", d="bf16") == 5e-2


def fast_accum_config(**kw):
    """A GemmConfig of an fp8 fast-accumulation instance (manifest config fp8_fast_accum: true). GemmConfig
    reads it into `fast_accum`; a GemmConfig without that field yet gets a copy that carries it."""
    cfg = GemmConfig.from_entry(entry("x", fp8_fast_accum=True, **kw))
    if not getattr(cfg, "fast_accum", False):
        from types import SimpleNamespace

        cfg = SimpleNamespace(**vars(cfg), fast_accum=True)
    return cfg


FP8 = dict(a="e4m3", b="e4m3", c="bf16", d="bf16", arch="sm90a")


def test_fp8_fast_accum_tolerance_grows_with_k():
    from emitter.families.gemm.reference import element_tolerances, fast_accum_tolerance

    plain = GemmConfig.from_entry(entry("x", **FP8))
    fast = fast_accum_config(**FP8)
    assert fast_accum_tolerance(plain, 4096) == 0.0
    # 10 * sqrt(number of 32-deep wgmma k-blocks) * 2^-13, on top of the fp8 element allowance
    assert fast_accum_tolerance(fast, 4096) == pytest.approx(10 * math.sqrt(128) * 2.0 ** -13)
    assert fast_accum_tolerance(fast, 33) == pytest.approx(10 * math.sqrt(2) * 2.0 ** -13)
    assert fast_accum_tolerance(fast) == fast_accum_tolerance(fast, 16384)     # K unknown: a large one
    base = element_tolerances(plain, 4096)[1]
    assert element_tolerances(fast, 4096)[1] == pytest.approx(base + fast_accum_tolerance(fast, 4096))
    assert element_tolerances(fast, 1024)[1] < element_tolerances(fast, 4096)[1] < element_tolerances(fast, 65536)[1]
    # estimated max |D - ref| / (|ref| + rms) under fast accumulation (a truncation model, see reference.py;
    # not a GPU measurement): covered at least twice over; the plain fp8 bound would fail the longest reduction
    for k, measured in ((4096, 5.4e-3), (16384, 1.23e-2), (65536, 3.0e-2)):
        assert element_tolerances(fast, k)[1] >= 2 * measured
    assert element_tolerances(plain, 65536)[1] < 3.0e-2
    # the relative Frobenius tolerance is unchanged (7e-3 estimated at K = 65536)
    assert tolerance(fast) == tolerance(plain) == 5e-2
    # only fp8: a bf16 config that somehow says fast_accum keeps its bounds
    bf16 = fast_accum_config(a="bf16", b="bf16", c="bf16", d="bf16", arch="sm90a")
    assert element_tolerances(bf16, 65536) == element_tolerances(
        GemmConfig.from_entry(entry("x", a="bf16", b="bf16", c="bf16", d="bf16")), 65536)


def _truncating_fp8_gemm(A, B, bits=13, block=32):
    """A model of unpromoted fp8 accumulation: per k-block, the running sum and the products are aligned
    to the largest exponent and truncated to `bits` fraction bits, then summed (f32 registers)."""
    acc = np.zeros((A.shape[0], B.shape[1]))
    for j in range(0, A.shape[1], block):
        terms = np.concatenate([acc[:, None, :], A[:, j:j + block, None] * B[None, j:j + block, :]], axis=1)
        top = np.abs(terms).max(axis=1)
        q = 2.0 ** (np.floor(np.log2(np.where(top > 0, top, 1.0))) - bits)[:, None, :]
        acc = (np.trunc(terms / q) * q).sum(axis=1).astype(np.float32).astype(np.float64)
    return acc


def test_fp8_fast_accum_error_model_passes_and_a_wrong_element_still_fails():
    fast = fast_accum_config(**{**FP8, "d": "f32", "c": "f32"})
    rng = np.random.default_rng(3)
    k = 8192
    A = decode(encode(rng.standard_normal((1, 24, k)), DType.e4m3), DType.e4m3)
    B = decode(encode(rng.standard_normal((1, k, 24)), DType.e4m3), DType.e4m3)
    ref = A @ B
    got = _truncating_fp8_gemm(A[0], B[0])[None]
    assert np.abs(got - ref).max() > 0                          # the model does lose bits
    assert compare(fast, encode(got, DType.f32), ref, exact=False, k=k).status == "PASSED"
    bad = got.copy()
    bad[0, 2, 3] += 0.5 * np.sqrt(k)                             # half the typical magnitude: a wrong term
    r = compare(fast, encode(bad, DType.f32), ref, exact=False, k=k)
    assert r.status == "FAILED" and (r.worst["row"], r.worst["col"]) == (2, 3)


def test_fp8_fast_accum_keeps_exact_small_integer_checks():
    """Sums of integers up to 2^13 survive 13 kept bits: the int problems stay bit-exact."""
    fast = fast_accum_config(**FP8)
    p = GemmProblem(64, 64, 2048).resolved(fast)
    r, rc, exact = int_plan(fast, p)
    assert exact and p.k * r * r <= 1 << 13
    rng = np.random.default_rng(4)
    A = rng.integers(-r, r + 1, size=(64, 2048)).astype(np.float64)
    B = rng.integers(-r, r + 1, size=(2048, 64)).astype(np.float64)
    assert np.array_equal(_truncating_fp8_gemm(A, B), A @ B)
    assert int_plan(fast, p) == int_plan(GemmConfig.from_entry(entry("x", **FP8)), p)


def _check(cfg, ref, got_values, exact):
    return compare(cfg, encode(got_values, cfg.d), ref, exact)


def test_compare_catches_wrong_nan_unwritten_and_passes_rounding():
    cfg = GemmConfig.from_entry(entry("x", c="bf16", d="bf16"))
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 256, 256)) * 10
    ok = _check(cfg, ref, ref, exact=False)
    assert ok.status == "PASSED" and 0 < ok.rel_err < 4e-3
    bad = ref.copy()
    bad[0, 5, 7] += 20.0                        # one element: hides in the norm, not from the element bound
    r = _check(cfg, ref, bad, exact=False)
    assert r.status == "FAILED" and (r.worst["row"], r.worst["col"]) == (5, 7) and r.rel_err < 1e-2
    nan = ref.copy()
    nan[0, 1, 2] = np.nan
    r = _check(cfg, ref, nan, exact=False)
    assert r.status == "FAILED" and "NaN" in r.reason and r.nonfinite == 1
    inf = ref.copy()
    inf[0, 0, 0] = np.inf
    assert _check(cfg, ref, inf, exact=False).status == "FAILED"
    stored = encode(ref, cfg.d)
    stored[0, 63, 47] = poison_value(cfg.d)
    r = compare(cfg, stored, ref, exact=False)
    assert r.status == "FAILED" and "never written" in r.reason and r.worst["row"] == 63
    # exact: integers bit for bit
    iref = np.round(ref)
    assert _check(cfg, iref, iref, exact=True).status == "PASSED"
    off = iref.copy()
    off[0, 3, 3] += 1
    r = _check(cfg, iref, off, exact=True)
    assert r.status == "FAILED" and r.mismatches == 1 and r.check == "exact"


def test_compare_integer_output_poison_equal_to_result_is_not_unwritten():
    cfg = GemmConfig.from_entry(entry("x", a="s8", b="s8", c="s8", d="s8", accumulator="s32"))
    ref = np.full((1, 2, 2), 127.0)          # saturated results equal the poison byte
    assert compare(cfg, encode(ref, DType.s8), ref, exact=True).status == "PASSED"
    ref2 = np.full((1, 2, 2), 5.0)
    got = encode(ref2, DType.s8)
    got[0, 1, 1] = poison_value(DType.s8)
    r = compare(cfg, got, ref2, exact=True)
    assert r.status == "FAILED" and r.unwritten == 1


def test_int_inputs_are_exact_only_when_sums_fit():
    cfg = GemmConfig.from_entry(entry("x"))
    assert int_plan(cfg, GemmProblem(64, 64, 4096))[2] is True
    assert int_plan(cfg, GemmProblem(64, 64, 4096, alpha=1.5))[2] is False
    cfg_sk = GemmConfig.from_entry(entry("x", c="bf16", d="bf16", split_k="serial"))
    r, rc, exact = int_plan(cfg_sk, GemmProblem(64, 64, 4096, split_k=2))
    assert not exact                                            # partials pass through bf16
    gelu = GemmConfig.from_entry(entry("x", epilogue={"activation": "gelu", "bias": "none"}))
    assert int_plan(gelu, GemmProblem(8, 8, 8))[2] is False


def test_inputs_never_zero_and_padding_poisoned():
    cfg = GemmConfig.from_entry(entry("x"))
    p = GemmProblem(16, 16, 16, lda=24, ldb=32, ldc=24, ldd=40).resolved(cfg)
    inp = make_inputs(cfg, p, "normal", 1)
    assert np.count_nonzero(inp.A) == inp.A.size
    a = decode(inp.buffers['A'], DType.f16)
    outside = np.ones(a.size, bool)
    outside[inp.layouts["A"].index().ravel()] = False
    assert np.isnan(a[outside]).all()
    assert (bits_of(inp.buffers['D']) == bits_of(np.asarray(poison_value(DType.f16)).reshape(1))[0]).all()
    i1 = make_inputs(cfg, p, "int", 3)
    i2 = make_inputs(cfg, p, "int", 3)
    assert np.array_equal(i1.A, i2.A) and i1.exact


# ---------------------------------------------------------------------------------------------- runner
def test_fake_backend_clean_run_passes(tmp_path):
    entries = [entry("g_f16"), entry("g_bf16_relu_bias", a="bf16", b="bf16", c="bf16", d="bf16", layout_a="col",
                                     epilogue={"activation": "relu", "bias": "row"}),
               entry("g_f32_gelu", a="f32", b="f32", c="f32", d="f32", op_class="simt", alignment_a=4,
                     alignment_b=4, alignment_c=4, epilogue={"activation": "gelu", "bias": "column"}),
               entry("g_s8_clamp", a="s8", b="s8", c="s8", d="s8", accumulator="s32", alignment_a=16, alignment_b=16,
                     epilogue={"activation": "clamp", "bias": "none", "clamp_min": -20.0, "clamp_max": 30.0}),
               entry("g_e4m3_silu", arch="sm90a", a="e4m3", b="e4m3", c="bf16", d="bf16", alignment_a=16,
                     alignment_b=16, epilogue={"activation": "silu", "bias": "none"}, batched=True,
                     split_k="serial")]
    run = run_fake(tmp_path, entries, problems=None)
    assert run.failed == 0, [r for r in run.results if r["status"] == "FAILED"]
    assert set(instance_status(run.results).values()) == {"PASSED"}
    assert any(r.get("check") == "exact" and r["status"] == "PASSED" for r in run.results)
    assert exit_code(run) == 0


@pytest.mark.parametrize("fault,problem,expect", [
    ({"kind": "wrong"}, "*int", "differ bit for bit"),
    ({"kind": "wrong", "delta": 1.0}, "*normal", "element-wise bound"),
    ({"kind": "nan"}, "*normal", "NaN"),
    ({"kind": "unwritten"}, "*", "never written"),
    ({"kind": "unwritten", "row": True}, "*", "never written"),
    ({"kind": "wrong_ld"}, "*lda*", "never written"),
    ({"kind": "swap_layout"}, "*int", "differ|NaN"),
    ({"kind": "drop_beta"}, "*beta0.5*", "rel err"),
    ({"kind": "wrong_activation", "activation": "relu"}, "*", ""),
    ({"kind": "skip_last_k"}, "*int", "differ|NaN"),
    ({"kind": "noise", "eps": 0.05}, "*normal", "rel err"),
    ({"kind": "illegal_address"}, "*", "illegal memory access"),
    ({"kind": "launch_error"}, "*", "launch failed"),
])
def test_planted_fault_fails(tmp_path, fault, problem, expect):
    problems = SMALL + [VerifyProblem(GemmProblem(64, 64, 32, lda=40, ldb=48, ldc=72, ldd=80), "int", source="user")]
    run = run_fake(tmp_path, [entry("victim"), entry("bystander")], [{"select": "victim", **fault}],
                   problems=problems)
    victim = [r for r in run.results if r["instance"] == "victim" and fnmatch.fnmatch(r["problem"], problem)]
    assert victim and all(r["status"] == "FAILED" for r in victim), victim
    assert all(re.search(expect, r["reason"]) for r in victim), [r["reason"] for r in victim]
    assert all(r["status"] == "PASSED" for r in run.results if r["instance"] == "bystander")
    assert exit_code(run) == 1


def test_cannot_implement_is_skipped_not_passed(tmp_path):
    run = run_fake(tmp_path, [entry("a")], [{"kind": "cannot_implement", "problem": "*normal"}])
    st = {r["problem"]: r["status"] for r in run.results}
    assert sorted(st.values()) == ["PASSED", "SKIPPED"]
    user = [VerifyProblem(GemmProblem(64, 64, 33), "int", source="user")]
    run = run_fake(tmp_path, [entry("a")], problems=user)
    assert run.results[0]["status"] == "SKIPPED" and "k=33" in run.results[0]["reason"]
    assert exit_code(run) == 0


def test_instance_that_runs_nothing_fails(tmp_path):
    run = run_fake(tmp_path, [entry("a")], [{"kind": "cannot_implement"}], problems=None)
    assert run.results[-1]["problem"] == "(default set)" and run.results[-1]["status"] == "FAILED"


def test_crash_and_cuda_fault_isolated_run_continues(tmp_path):
    """Process isolation: a worker that dies, one that reports an illegal address and one that hangs are
    each FAILED with the reason; the other instances still run and pass."""
    entries = [entry("crasher"), entry("faulter"), entry("hanger"), entry("healthy")]
    faults = [{"select": "crasher", "kind": "crash", "problem": "*int"},
              {"select": "faulter", "kind": "illegal_address", "problem": "*int"},
              {"select": "hanger", "kind": "hang", "seconds": 60, "problem": "*int"}]
    run = run_fake(tmp_path, entries, faults, isolation=True, timeout=2.0)
    res = {(r["instance"], r["problem"].split("_")[-1]): r for r in run.results}
    assert res[("crasher", "int")]["status"] == "FAILED" and "worker process died" in res[("crasher", "int")]["reason"]
    assert res[("crasher", "normal")]["status"] == "PASSED"        # fresh worker, same instance
    assert "illegal memory access" in res[("faulter", "int")]["reason"]
    assert res[("faulter", "normal")]["status"] == "PASSED"
    assert "timeout" in res[("hanger", "int")]["reason"]
    assert res[("hanger", "normal")]["status"] == "SKIPPED"
    assert res[("healthy", "int")]["status"] == "PASSED" and res[("healthy", "normal")]["status"] == "PASSED"
    assert exit_code(run) == 1


def test_not_built_is_skipped(tmp_path):
    root = write_manifest(tmp_path / "m", [entry("a")])
    opts = VerifyOptions(backend="fake", backend_options={"require_build": True}, isolation=False, seed=1)
    run = verify(root, [entry("a")], SMALL, opts)
    assert {r["status"] for r in run.results} == {"SKIPPED"} and "not built" in run.results[0]["reason"]
    (root / "build" / "a").mkdir(parents=True)
    (root / "build" / "a" / "record.json").write_text(json.dumps({"status": "failed", "error": "nvcc: boom",
                                                                  "artifacts": {}}))
    run = verify(root, [entry("a")], SMALL, opts)
    assert "build failed" in run.results[0]["reason"]


def test_seed_replays(tmp_path):
    a = run_fake(tmp_path, [entry("a")], seed=11)
    b = run_fake(tmp_path, [entry("a")], seed=11)
    assert [r["seed"] for r in a.results] == [r["seed"] for r in b.results]
    assert [r["max_abs_err"] for r in a.results] == [r["max_abs_err"] for r in b.results]


# ---------------------------------------------------------------------------------------------- reports
def test_reports_json_junit(tmp_path):
    run = run_fake(tmp_path, [entry("good"), entry("bad")], [{"select": "bad", "kind": "nan", "problem": "*normal"}])
    data = json.loads(json.dumps(to_json(run)))
    assert data["summary"]["cases"] == {"PASSED": 3, "FAILED": 1, "SKIPPED": 0}
    assert data["seed"] == 7 and data["backend"] == "fake"
    bad = [r for r in data["results"] if r["status"] == "FAILED"][0]
    assert bad["worst"]["row"] == 135 and bad["seed"] and "rel_err" in bad and "max_abs_err" in bad
    xml = ET.fromstring(to_junit(run))
    assert xml.get("failures") == "1" and xml.get("tests") == "4"
    assert len(xml.findall(".//failure")) == 1 and len(xml.findall("testsuite")) == 2


def test_cli_verify_fake(tmp_path):
    root = write_manifest(tmp_path / "m", [entry("g1"), entry("g2")])
    faults = json.dumps([{"select": "g2", "kind": "wrong", "problem": "*int"}])
    cmd = [sys.executable, "-m", "emitter", "verify", str(root), "--backend", "fake", "--quick", "--seed", "3",
           "--m", "64", "--n", "64", "--k", "64", "--beta", "0.5", "--no-isolation", "--fake-faults", faults, "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED" in out.stdout and "g2" in out.stdout
    res = json.loads((root / "verify" / "results.json").read_text())
    assert res["summary"]["instances"] == {"PASSED": 1, "FAILED": 1, "SKIPPED": 0}
    assert (root / "verify" / "junit.xml").is_file()
    ok = subprocess.run(cmd[:-3] + ["--select", "g1", "-q"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(cmd[:7] + ["--m", "64"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--n" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------------------------------------- ABI + PyCUDA path
_LAYOUT_C = r"""
#include <stdio.h>
#include <stddef.h>
#include "emitter_abi.h"
#define P(T, f) printf("%s.%s %zu\n", #T, #f, offsetof(T, f));
int main(void) {
  printf("problem %zu %zu\nlaunch %zu %zu\n", sizeof(emitter_gemm_problem), _Alignof(emitter_gemm_problem),
         sizeof(emitter_launch), _Alignof(emitter_launch));
  %FIELDS%
  return 0;
}
"""


def _cc():
    return shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(_cc() is None, reason="no C compiler")
def test_ctypes_structs_match_emitter_abi_h(tmp_path):
    fields = [f"P(emitter_gemm_problem, {n})" for n, _ in EmitterGemmProblem._fields_]
    fields += [f"P(emitter_launch, {n})" for n, _ in EmitterLaunch._fields_]
    src = tmp_path / "layout.c"
    src.write_text(_LAYOUT_C.replace("%FIELDS%", "\n  ".join(fields)))
    exe = tmp_path / "layout"
    subprocess.run([_cc(), "-std=c11", f"-I{ROOT / 'templates' / 'common'}", "-o", str(exe), str(src)], check=True)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    assert lines[0] == f"problem {ctypes.sizeof(EmitterGemmProblem)} {ctypes.alignment(EmitterGemmProblem)}"
    assert lines[1] == f"launch {ctypes.sizeof(EmitterLaunch)} {ctypes.alignment(EmitterLaunch)}"
    got = dict(line.split() for line in lines[2:] if line)
    for struct, name in ((EmitterGemmProblem, "emitter_gemm_problem"), (EmitterLaunch, "emitter_launch")):
        for f, _ in struct._fields_:
            assert int(got[f"{name}.{f}"]) == getattr(struct, f).offset, f


# A C mock of an instance's host shim: Params = the resolved problem; it rejects k not a multiple of 16.
_MOCK_SHIM = r"""
#include <string.h>
#include "emitter_abi.h"
typedef struct { emitter_gemm_problem p; } Params;
static int fill(const emitter_gemm_problem* p, emitter_launch* out) {
  if (!p || !out) return EMITTER_INVALID_ARGUMENT;
  if (p->k > 32 && p->k % 16) return EMITTER_CANNOT_IMPLEMENT;
  memset(out, 0, sizeof *out);
  out->grid[0] = (p->n + 15) / 16; out->grid[1] = (p->m + 15) / 16; out->grid[2] = p->batch_count;
  out->block[0] = 16; out->block[1] = 16; out->block[2] = 1;
  out->cluster[0] = out->cluster[1] = out->cluster[2] = 1;
  out->shared_bytes = 64 * 1024; out->params_bytes = sizeof(Params); out->params_align = 8;
  out->workspace_bytes = p->split_k_slices > 1 ? 256 : 0;
  return EMITTER_OK;
}
int emitter_mock_query(const emitter_gemm_problem* p, emitter_launch* out) { return fill(p, out); }
int emitter_mock_initialize(const emitter_gemm_problem* p, void* ws, void* stream, void* params, int cap,
                            emitter_launch* out) {
  int s = fill(p, out); if (s) return s;
  if (cap < (int)sizeof(Params)) return EMITTER_BUFFER_TOO_SMALL;
  if (out->workspace_bytes && !ws) return EMITTER_INVALID_ARGUMENT;
  memcpy(params, p, sizeof(Params));
  return EMITTER_OK;
}
const char* emitter_mock_name(void) { return "mock"; }
"""

# A mock of the few pycuda.driver pieces the backend uses: "device" memory is host memory, and the
# "kernel" reads its Params (the problem) through the pointer and computes the GEMM in numpy.
_MOCK_DRIVER = textwrap.dedent(r'''
    import ctypes, json, os
    import numpy as np
    class Error(Exception): pass
    class LaunchError(Error): pass
    class LogicError(Error): pass
    _keep = {}
    class DeviceAllocation:
        def __init__(self, n):
            self.buf = ctypes.create_string_buffer(n); self.ptr = ctypes.addressof(self.buf); _keep[self.ptr] = self.buf
        def __int__(self): return self.ptr
        def __index__(self): return self.ptr
        def free(self): _keep.pop(self.ptr, None)
    def mem_alloc(n): return DeviceAllocation(n)
    def memcpy_htod(dst, src):
        src = bytes(src) if isinstance(src, (bytes, bytearray)) else np.ascontiguousarray(src).tobytes()
        ctypes.memmove(int(dst), src, len(src))
    def memcpy_dtoh(dst, src): ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)
    class Stream:
        handle = 0
        def synchronize(self): pass
    class Event:
        def record(self, stream=None): pass
        def synchronize(self): pass
        def time_since(self, other): return 0.25
    class _A:
        MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        MULTIPROCESSOR_COUNT = 16
    function_attribute = device_attribute = _A
    class Device:
        def name(self): return "Mock GPU"
        def compute_capability(self): return (9, 0)
        def get_attribute(self, a): return 132
    class Context:
        @staticmethod
        def get_device(): return Device()
        @staticmethod
        def synchronize(): pass
    LAUNCHES = []
    class DriverKernel:
        """Stands in for emitter.kit.launcher.DriverKernel: the "cubin" is the manifest entry as JSON."""
        def __init__(self, cubin, symbol):
            self.spec = json.loads(open(cubin).read())
            assert symbol == "emitter_" + self.spec["name"] + "_kernel", symbol
            self.max_dynamic_shared = 48 * 1024
        def allow_shared(self, n): self.max_dynamic_shared = max(self.max_dynamic_shared, n)
        def launch(self, grid, block, shared, stream, packed):
            from emitter.families.gemm.abi import EmitterGemmProblem
            from emitter.families.gemm.layout import MatrixLayout
            from emitter.kit.hostdata import decode, encode
            from emitter.families.gemm.config import GemmConfig
            assert shared <= self.max_dynamic_shared, "dynamic shared memory limit not raised"
            # by value: the Params bytes travel in the launch itself (the mock shim's Params = the problem)
            p = EmitterGemmProblem.from_buffer_copy(packed.data()[:ctypes.sizeof(EmitterGemmProblem)])
            assert ctypes.cast(packed.array, ctypes.POINTER(ctypes.c_void_p))[0] % 64 == 0, "Params not 64-byte aligned"
            cfg = GemmConfig.from_entry(self.spec)
            def view(ptr, lay, dt):
                from emitter.kit.hostdata import storage_dtype
                n = lay.elements(); sd = storage_dtype(dt)
                return np.frombuffer((ctypes.c_char * (n * sd.itemsize)).from_address(ptr), dtype=sd)
            la = MatrixLayout(p.m, p.k, cfg.row_major_a, p.lda, p.batch_count, p.batch_stride_A)
            lb = MatrixLayout(p.k, p.n, cfg.row_major_b, p.ldb, p.batch_count, p.batch_stride_B)
            lc = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldc, p.batch_count, p.batch_stride_C)
            ld = MatrixLayout(p.m, p.n, cfg.row_major_c, p.ldd, p.batch_count, p.batch_stride_D)
            A = decode(la.gather(view(p.A, la, cfg.a)), cfg.a); B = decode(lb.gather(view(p.B, lb, cfg.b)), cfg.b)
            z = p.alpha * (A @ B)
            if p.beta: z = z + p.beta * decode(lc.gather(view(p.C, lc, cfg.c)), cfg.c)
            out = view(p.D, ld, cfg.d).copy(); ld.scatter(out, encode(z, cfg.d))
            ctypes.memmove(p.D, out.ctypes.data, out.nbytes)
            LAUNCHES.append((grid, block, shared))
    def init(): pass
''')


@pytest.mark.skipif(_cc() is None, reason="no C compiler")
def test_pycuda_backend_launch_path_with_mock_driver(tmp_path, monkeypatch):
    """The PyCUDA backend end to end (build record, ctypes shim, workspace, Params packed by value and
    64-byte aligned, shared memory attribute, launch, copy back) against a mock driver; the verifier must
    pass the right kernel and fail one whose shim rejects sizes."""
    mock = tmp_path / "mock"
    (mock / "pycuda").mkdir(parents=True)
    (mock / "pycuda" / "__init__.py").write_text("")
    (mock / "pycuda" / "autoprimaryctx.py").write_text("")
    (mock / "pycuda" / "driver.py").write_text(_MOCK_DRIVER)
    monkeypatch.syspath_prepend(str(mock))
    for mod in [m for m in sys.modules if m == "pycuda" or m.startswith("pycuda.")]:
        monkeypatch.delitem(sys.modules, mod)
    import pycuda.driver as mock_driver  # the mock above
    import emitter.runtime.pycuda_backend as backend_module
    monkeypatch.setattr(backend_module, "DriverKernel", mock_driver.DriverKernel)
    ent = entry("mock", layout_a="col")
    root = write_manifest(tmp_path / "m", [ent])
    bdir = root / "build" / "mock"
    bdir.mkdir(parents=True)
    (bdir / "mock.cubin").write_text(json.dumps(ent))   # the mock driver "loads" the entry
    (tmp_path / "shim.c").write_text(_MOCK_SHIM)
    subprocess.run([_cc(), "-shared", "-fPIC", f"-I{ROOT / 'templates' / 'common'}", "-o", str(bdir / "libmock.so"),
                    str(tmp_path / "shim.c")], check=True)
    (bdir / "record.json").write_text(json.dumps({"status": "ok", "artifacts": {"cubin": "build/mock/mock.cubin",
                                                                                "host": "build/mock/libmock.so"}}))
    problems = SMALL + [VerifyProblem(GemmProblem(64, 64, 40), "int", source="user"),
                        VerifyProblem(GemmProblem(40, 24, 16, lda=48, ldc=32, ldd=40, beta=2.0), "int", source="user")]
    opts = VerifyOptions(backend="pycuda", backend_options={"device_reference": False}, isolation=False, seed=5)
    run = verify(root, [ent], problems, opts)
    st = [(r["problem"], r["status"], r.get("reason")) for r in run.results]
    assert [s[1] for s in st] == ["PASSED", "PASSED", "SKIPPED", "PASSED"], st
    assert "EMITTER_CANNOT_IMPLEMENT" in st[2][2]
    r0 = run.results[0]
    assert r0["launch"]["grid"] == [3, 5, 1] and r0["launch"]["shared_bytes"] == 65536 and r0["time_ms"] == 0.25
    assert run.device.startswith("Mock GPU")
    assert mock_driver.LAUNCHES and mock_driver.LAUNCHES[0][2] == 65536


def test_serial_split_k_allows_partials_rounded_to_d():
    """2.x serial split-K rounds each slice's partial sum to D's type: allowed, but only then."""
    cfg = GemmConfig.from_entry(entry("x", a="bf16", b="bf16", c="bf16", d="bf16", split_k="serial"))
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((1, 128, 128)) * 64
    got = ref.copy()
    got[0, 3, 4] += 1.4                       # what 4 slices of bf16 partials did on an H200
    assert _check(cfg, ref, got, exact=False).status == "FAILED"
    assert compare(cfg, encode(got, cfg.d), ref, False, split_k=4).status == "PASSED"
    got[0, 3, 4] += 30.0
    assert compare(cfg, encode(got, cfg.d), ref, False, split_k=4).status == "FAILED"


def test_sourceless_instances_verify_with_beta_zero_and_refuse_beta(tmp_path):
    """`epilogue: {source: false}` (sm90a void C): the default problems keep their shapes with beta = 0, a user
    problem with beta != 0 is named as one it cannot run, and the (fake) shim refuses it."""
    e = entry("nosrc", arch="sm90a", epilogue={"activation": "identity", "bias": "none", "source": False},
              cluster=[1, 1, 1], warp=None, tile=[128, 128, 64])
    cfg = GemmConfig.from_entry(e)
    twin = entry("src", arch="sm90a", cluster=[1, 1, 1], warp=None, tile=[128, 128, 64])
    assert not cfg.source and GemmConfig.from_entry(twin).source
    probs = default_problems(cfg, quick=True)
    assert probs and all(p.problem.beta == 0.0 for p in probs)
    with_c = default_problems(GemmConfig.from_entry(twin), quick=True)
    assert {(p.problem.m, p.problem.n, p.problem.k) for p in probs} == {(p.problem.m, p.problem.n, p.problem.k) for p in with_c}
    assert "no C operand" in cannot_run_reason(cfg, GemmProblem(128, 128, 128, beta=0.5))
    run = run_fake(tmp_path, [e])
    res = by_problem(run)
    statuses = {label: r["status"] for label, r in res.items()}
    assert sorted(statuses.values()) == ["PASSED", "SKIPPED"], statuses
    skipped = [r for r in res.values() if r["status"] == "SKIPPED"][0]
    assert "no C operand" in json.dumps(skipped)
