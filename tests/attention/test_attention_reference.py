"""Attention family (issue 27): the float64 reference against a naive loop, the fake backend (independent
arithmetic) against the reference on random problems (GQA/MQA, varlen with empty sequences, both causal
alignments with seq_q != seq_k, lengths that are not tile multiples, LSE, layouts, scale, large magnitudes),
planted faults each caught for its reason, exact FLOPs, problems and the fake-backend verify pipeline."""

import itertools
import math

import numpy as np
import pytest

from emitter.dtypes import DType
from emitter.errors import SpecError
from emitter.families.attention import runtime, sm80
from emitter.families.attention.check import compare
from emitter.families.attention.fake import FAKE_FAULTS, fake_run
from emitter.families.attention.flops import flops, visible_pairs
from emitter.families.attention.inputs import make_inputs
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask
from emitter.families.attention.problem import make_problem, not_supported_reasons, parse_problem, visible_keys
from emitter.families.attention.reference import reference, reference_sequence


def inst_for(mask=Mask.none, dtype=DType.f16, d=64, dv=None, tile=(64, 64), lse=True, gqa=True, varlen=False,
             layout=Layout.bshd):
    r = sm80.resolve(AttentionInstance(Arch.sm80, dtype, d, dv or d, tile[0], tile[1], mask=mask, lse=lse, gqa=gqa,
                                       varlen=varlen, layout=layout))
    assert isinstance(r, AttentionInstance), r
    return r


def naive(q, k, v, scale, mask):
    """One loop per (head, row): the definition, no vectorization shared with the reference."""
    hq, sq, _ = q.shape
    hkv, sk, dv = v.shape
    o = np.zeros((hq, sq, dv))
    lse = np.full((hq, sq), -np.inf)
    for h in range(hq):
        g = h // (hq // hkv)
        for i in range(sq):
            n = visible_keys(mask, sq, sk, i)
            if n == 0:
                continue
            s = [scale * float(np.dot(q[h, i], k[g, j])) for j in range(n)]
            m = max(s)
            w = [math.exp(x - m) for x in s]
            tot = sum(w)
            o[h, i] = sum(wj * v[g, j] for j, wj in enumerate(w)) / tot
            lse[h, i] = m + math.log(tot)
    return o, lse


@pytest.mark.parametrize("mask", ["none", "causal_top_left", "causal_bottom_right"])
@pytest.mark.parametrize("sq,sk", [(7, 7), (9, 4), (4, 11), (1, 5), (6, 0)])
def test_reference_matches_naive_loop(mask, sq, sk):
    rng = np.random.default_rng(sq * 31 + sk)
    q = rng.standard_normal((4, sq, 8))
    k = rng.standard_normal((2, sk, 8))
    v = rng.standard_normal((2, sk, 5))
    o, lse = reference_sequence(q, k, v, 0.37, mask)
    o2, lse2 = naive(q, k, v, 0.37, mask)
    np.testing.assert_allclose(o, o2, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse2))
    np.testing.assert_allclose(lse[np.isfinite(lse)], lse2[np.isfinite(lse2)], rtol=1e-12)


def test_reference_is_stable_for_large_scores():
    q = np.full((1, 2, 4), 100.0)
    k = np.full((1, 3, 4), 100.0)
    v = np.arange(3.0).reshape(1, 3, 1)
    o, lse = reference_sequence(q, k, v, 1.0, "none")
    assert np.all(np.isfinite(o)) and np.allclose(o, 1.0)
    assert np.allclose(lse, 40000 + math.log(3))


PROBLEMS = [
    dict(batch=2, heads_q=4, heads_kv=2, seq_q=70, seq_k=33, head_dim=64, scale=0.3),       # GQA, sq > sk
    dict(batch=1, heads_q=4, heads_kv=1, seq_q=17, seq_k=130, head_dim=64),                  # MQA, sq < sk
    dict(batch=2, heads_q=2, heads_kv=2, seq_q=65, seq_k=65, head_dim=64, layout="bhsd"),
    dict(heads_q=4, heads_kv=2, seqlens_q=(5, 70, 1, 3), seqlens_k=(9, 65, 0, 3), head_dim=64),  # varlen, empty
    dict(heads_q=2, heads_kv=1, seqlens_q=(40, 2), seqlens_k=(3, 77), head_dim=64, layout="bhsd", scale=0.2),
]


@pytest.mark.parametrize("mask", list(Mask))
@pytest.mark.parametrize("pi", range(len(PROBLEMS)))
@pytest.mark.parametrize("dtype,data", [(DType.f16, "normal"), (DType.bf16, "int"), (DType.f16, "large")])
def test_fake_matches_reference(mask, pi, dtype, data):
    kw = PROBLEMS[pi]
    p = make_problem(**kw)
    inst = inst_for(mask=mask, dtype=dtype, varlen=p.varlen)
    inp = make_inputs(inst, p, data, seed=pi)
    ref = reference(inst, p, inp)
    out = fake_run(inst, p, inp.buffers, {})
    v = compare(inst, p, inp, out, ref)
    assert v["status"] == "PASSED", v
    assert v["unwritten"] == 0 and v["nonfinite"] == 0
    assert v["rel_err"] < v["tol"] / 4          # margin: the tolerance is not what makes it pass


def test_head_dim_v_differs():
    inst = inst_for(d=96, dv=64, tile=(64, 128), mask=Mask.causal_top_left)
    p = make_problem(batch=1, heads_q=2, heads_kv=1, seq_q=50, seq_k=70, head_dim=96, head_dim_v=64)
    inp = make_inputs(inst, p, "normal", 3)
    assert compare(inst, p, inp, fake_run(inst, p, inp.buffers, {}), reference(inst, p, inp))["status"] == "PASSED"


def case(fault, mask=Mask.none, **kw):
    args = dict(batch=2, heads_q=4, heads_kv=2, seq_q=70, seq_k=65, head_dim=64, scale=0.3)
    args.update(kw)
    p = make_problem(**args)
    inst = inst_for(mask=mask, varlen=p.varlen)
    inp = make_inputs(inst, p, "normal", 7)
    ref = reference(inst, p, inp)
    return compare(inst, p, inp, fake_run(inst, p, inp.buffers, {fault: {}} if fault else {}), ref)


def test_planted_wrong_scale_fails_every_row_and_lse():
    v = case("wrong_scale")
    assert v["status"] == "FAILED" and v["lse_failed"] and v["failed_heads"] == [0, 1, 2, 3]
    assert v["failed_rows"] == 2 * 70                 # every row of both sequences
    assert case("wrong_scale", scale=1 / 8)["status"] == "PASSED"      # 1/sqrt(64): the bug cannot show


@pytest.mark.parametrize("mask", [Mask.causal_top_left, Mask.causal_bottom_right])
def test_planted_missing_mask_fails_only_masked_rows(mask):
    v = case("no_mask", mask=mask)
    assert v["status"] == "FAILED" and v["failed_full_rows"] == 0 and v["failed_masked_rows"] > 0
    assert case("no_mask", mask=Mask.none)["status"] == "PASSED"


def test_planted_key_tail_off_by_one_fails_only_with_a_partial_tile():
    v = case("key_tail_off_by_one", seq_k=65)          # tile_kv 64: one key in the last tile
    assert v["status"] == "FAILED" and v["lse_failed"]
    assert case("key_tail_off_by_one", seq_k=64)["status"] == "PASSED"


def test_planted_wrong_kv_head_fails_exactly_the_remapped_heads():
    v = case("wrong_kv_head", heads_q=8, heads_kv=2)
    # h // 4 vs h % 2 agree on heads 0 (0/0) and 5 (1/1) only
    assert v["status"] == "FAILED"
    assert v["failed_heads"] == [h for h in range(8) if h // 4 != h % 2]
    assert case("wrong_kv_head", heads_q=4, heads_kv=4)["status"] == "PASSED"   # no groups: nothing to confuse


def test_planted_skip_lse_is_unwritten():
    v = case("skip_lse")
    assert v["status"] == "FAILED" and v["unwritten"] > 0 and "never written" in v["reason"]


def test_every_fault_is_known():
    assert set(FAKE_FAULTS) == {"wrong_scale", "no_mask", "key_tail_off_by_one", "wrong_kv_head", "skip_lse", "lse_overrun"}
    with pytest.raises(ValueError):
        case("typo")


@pytest.mark.parametrize("mask", ["none", "causal_top_left", "causal_bottom_right"])
def test_visible_pairs_exact(mask):
    for sq, sk in itertools.product(range(0, 12), range(0, 12)):
        assert visible_pairs(mask, sq, sk) == sum(visible_keys(mask, sq, sk, i) for i in range(sq))


def test_flops_full_and_causal():
    p = make_problem(batch=2, heads_q=16, heads_kv=4, seq_q=1000, seq_k=1000, head_dim=128)
    assert flops(inst_for(d=128, tile=(32, 128)), p) == 4 * 2 * 16 * 1000 * 1000 * 128
    causal = flops(inst_for(d=128, tile=(32, 128), mask=Mask.causal_top_left), p)
    assert causal == 4 * 2 * 16 * (1000 * 1001 // 2) * 128


def test_problem_parser_and_errors():
    p = parse_problem("b=2,hq=16,hkv=4,sq=1000,sk=1000,d=128")
    assert (p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k, p.head_dim, p.head_dim_v) == (2, 16, 4, 1000, 1000, 128, 128)
    v = parse_problem("hq=8,hkv=2,lq=100:37:5,lk=120:37:0,d=64,layout=bhsd")
    assert v.varlen and v.batch == 3 and v.seq_q == 100 and v.total_k == 157 and v.cu_seqlens()[1] == [0, 120, 157, 157]
    for bad in ("b=2,hq=16,hkv=5,s=8,d=64", "b=2,hq=4,s=8", "b=2,hq=4,s=8,d=64,zz=1", "b=x,hq=4,s=8,d=64", ""):
        with pytest.raises(SpecError) as ei:
            parse_problem(bad)
        assert ei.value.exit_code == 2
    assert runtime.parse_problem("b=1,hq=2,s=5,d=64") == [{"batch": 1, "heads_q": 2, "seq_q": 5, "seq_k": 5, "head_dim": 64}]


def test_not_supported_reasons():
    inst = inst_for(gqa=False, d=64)
    p = make_problem(batch=1, heads_q=4, heads_kv=2, seq_q=5, seq_k=5, head_dim=64)
    assert any("GQA" in r for r in not_supported_reasons(inst, p))
    p2 = make_problem(batch=1, heads_q=4, heads_kv=4, seq_q=5, seq_k=5, head_dim=128)
    assert any("head dims" in r for r in not_supported_reasons(inst, p2))
    p3 = make_problem(heads_q=4, seqlens_q=(3,), seqlens_k=(4,), head_dim=64)
    assert any("varlen" in r for r in not_supported_reasons(inst, p3))


def test_c_problem_fields():
    inst = inst_for(varlen=True)
    p = make_problem(heads_q=4, heads_kv=2, seqlens_q=(5, 7), seqlens_k=(9, 3), head_dim=64, scale=0.5)
    c = runtime.c_problem(inst, p, {"q": 16, "k": 32, "v": 48, "o": 64, "lse": 80, "cu_seqlens_q": 96,
                                     "cu_seqlens_k": 112})
    assert (c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_k, c.total_q, c.total_k) == (2, 4, 2, 7, 9, 12, 12)
    assert list(c.stride_q) == [0, 4 * 64, 64] and list(c.stride_k) == [0, 2 * 64, 64]
    assert list(c.stride_lse) == [0, 12] and c.scale == 0.5
    assert (c.q, c.lse, c.cu_seqlens_k) == (16, 80, 112)
    d = runtime.problem_to_dict(p)
    assert runtime.problem_from_dict({**d, "label": "x", "data": "normal"}) == p


def test_fake_backend_verify_pipeline(tmp_path):
    """emit -> `emitter verify --backend fake` on a small attention spec: every case PASSED; a planted fault
    FAILS its cases."""
    from emitter.emit import emit
    from emitter.verify.runner import VerifyOptions, verify
    import json

    spec = tmp_path / "a.yaml"
    spec.write_text("kernels:\n  - family: attention\n    arch: sm80\n    dtype: f16\n    head_dim: 64\n"
                    "    tile: 64x64\n    mask: [none, causal_bottom_right]\n    lse: true\n    gqa: true\n")
    out = tmp_path / "out"
    emit([spec], out)
    entries = json.loads((out / "manifest.json").read_text())["instances"]
    run = verify(out, entries, None, VerifyOptions(backend="fake", quick=True))
    results = run.results if hasattr(run, "results") else run["results"]
    assert results and all(r["status"] == "PASSED" for r in results), [r["reason"] for r in results if r["status"] != "PASSED"]
    bad = verify(out, entries, None, VerifyOptions(backend="fake", quick=True,
                                                   backend_options={"faults": [{"kind": "wrong_kv_head"}]}))
    bres = bad.results if hasattr(bad, "results") else bad["results"]
    assert bres and all(r["status"] == "FAILED" for r in bres if "h8x2" in r["problem"])


def _fake_runner_spec(tmp_path):
    from emitter.emit import emit

    spec = tmp_path / "a.yaml"
    spec.write_text("kernels:\n  - family: attention\n    arch: sm80\n    dtype: bf16\n    head_dim: 64\n"
                    "    tile: 64x64\n    mask: causal_top_left\n    lse: true\n    gqa: true\n    varlen: [false, true]\n")
    out = tmp_path / "out"
    emit([spec], out)
    return out


def test_runner_on_the_fake_backend(tmp_path):
    """The in-process runner's path (load, inputs, run, reference, compare, PASS/FAIL lines) on the fake backend the
    caller constructs (the family imports no backend)."""
    from emitter.families.attention import runner
    from emitter.families.attention.problem import parse_problem_text
    from emitter.runtime.fake_backend import FakeBackend

    out = _fake_runner_spec(tmp_path)
    lines: list[str] = []
    results = runner.run(out, FakeBackend(), quick=True, seed=3, out=lines.append)
    assert results and all(v["status"] == "PASSED" for v in results), [v.get("reason") for v in results]
    assert not any(t.startswith("FAIL") for t in lines) and sum(t.startswith("PASS ") for t in lines) >= 8
    lines.clear()
    bad = runner.run(out, FakeBackend(faults=[{"kind": "no_mask"}]), quick=True, data="normal", out=lines.append)
    assert bad and all(v["status"] == "FAILED" for v in bad)
    assert all(t.startswith("FAIL ") and "full 0)" in t for t in lines), lines   # only rows the mask hides fail
    p = make_problem(**parse_problem_text("b=2,hq=4,hkv=2,s=80,d=64"))
    one = runner.run(out, FakeBackend(), select="*_gqa", problems=[(p, "normal")], out=lines.append)
    assert [v["status"] for v in one] == ["PASSED"]


def test_verify_in_process_says_where_a_failure_is(tmp_path):
    """What the runner's command line became: `emitter verify OUT --no-isolation` runs the cases in one process and
    its results.json locates each failure (a planted no_mask fails masked rows only); a bad --problem is a clean
    error."""
    import json

    from click.testing import CliRunner

    from emitter.cli import main

    out = _fake_runner_spec(tmp_path)
    ok = CliRunner().invoke(main, ["verify", str(out), "--backend", "fake", "--quick", "--no-isolation", "-q"])
    assert ok.exit_code == 0, ok.output
    res = CliRunner().invoke(main, ["verify", str(out), "--backend", "fake", "--quick", "--no-isolation", "-q",
                                    "--data", "normal", "--fake-faults", '[{"kind": "no_mask"}]'])
    assert res.exit_code == 1, res.output
    results = json.loads((out / "verify" / "results.json").read_text())["results"]
    assert results and all(r["status"] == "FAILED" for r in results)
    assert all(r["failed_masked_rows"] > 0 and r["failed_full_rows"] == 0 and r["failed_heads"] for r in results)
    bad = CliRunner().invoke(main, ["verify", str(out), "--backend", "fake", "--problem", "b=2,hq=4,d=64"])
    assert bad.exit_code == 2 and "--problem" in bad.output and "Traceback" not in bad.output, bad.output


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("varlen", [False, True])
def test_padded_rows_and_stray_writes(layout, varlen):
    kw = dict(seqlens_q=(20, 45), seqlens_k=(33, 0)) if varlen else dict(batch=2, seq_q=50, seq_k=70)
    p = make_problem(heads_q=4, heads_kv=2, head_dim=64, layout=layout, pad=8, **kw)
    s = p.strides()
    assert s["o"][1] == (4 * 64 + 8 if layout == "bshd" else 64 + 8)
    inst = inst_for(mask=Mask.causal_bottom_right, varlen=varlen, layout=Layout(layout))
    inp = make_inputs(inst, p, "normal", 2)
    ref = reference(inst, p, inp)
    ok = compare(inst, p, inp, fake_run(inst, p, inp.buffers, {}), ref)
    assert ok["status"] == "PASSED" and ok["stray_writes"] == 0, ok
    # CUTLASS's own LSE write pads each row to 32 with +inf: past the row, into the padding
    bad = compare(inst, p, inp, fake_run(inst, p, inp.buffers, {"lse_overrun": {}}), ref)
    assert bad["status"] == "FAILED" and bad["stray_writes"] > 0 and "stray writes" in bad["reason"], bad
    # without padding the same overrun lands on the next row's LSE, which its own block may or may not
    # overwrite later (block order): only the padding catches it every time
