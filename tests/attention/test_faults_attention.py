"""Attention's key-tail planted fault caught for its own reason, with and without LSE: the fake backend's extra
key is the K/V row that follows the sequence in memory (the next sequence's first row), what a kernel masking
the tail one key late reads, and the verdict fails exactly the sequences that have one; the torch float64
reference (what `emitter verify` uses on a GPU) equals the numpy one on the CPU."""

import numpy as np
import pytest

from emitter.dtypes import DType
from emitter.families.attention import sm80
from emitter.families.attention.check import compare
from emitter.families.attention.fake import fake_run
from emitter.families.attention.inputs import gather_outputs, make_inputs
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask
from emitter.families.attention.problem import make_problem
from emitter.families.attention.reference import reference, reference_sequence
from emitter.families.attention.tolerances import o_tolerance


def inst_for(lse=True, layout=Layout.bshd, varlen=False, gqa=True, mask=Mask.none):
    r = sm80.resolve(AttentionInstance(Arch.sm80, DType.f16, 64, 64, 64, 64, mask=mask, lse=lse, gqa=gqa,
                                       varlen=varlen, layout=layout))
    assert isinstance(r, AttentionInstance), r
    return r


def run(p, inst, fault="key_tail_off_by_one", seed=7):
    inp = make_inputs(inst, p, "normal", seed)
    out = fake_run(inst, p, inp.buffers, {fault: {}} if fault else {})
    return inp, out, compare(inst, p, inp, out, reference(inst, p, inp))


@pytest.mark.parametrize("lse", [True, False])
def test_key_tail_is_caught_with_and_without_lse(lse):
    p = make_problem(batch=3, heads_q=4, heads_kv=2, seq_q=70, seq_k=65, head_dim=64)
    _, _, v = run(p, inst_for(lse=lse))
    # sequences 0 and 1 read the next sequence's first row; the last one's next row is past the buffer
    assert v["status"] == "FAILED" and v["failed_batches"] == [0, 1], v["reason"]
    assert v["failed_heads"] == [0, 1, 2, 3] and v["failed_rows"] == 2 * 70 and v["failed_masked_rows"] == 0
    assert v["unwritten"] == 0 and v["reason"].startswith("O: ")
    if lse:
        assert v["lse_failed"] and v["lse_high_rows"] > 0 and v["lse_low_rows"] == 0      # an extra key adds mass
    else:
        assert not v["lse_failed"] and v["lse_max_abs_err"] is None
    # a key count that fills its last tile: the late mask never shows
    assert run(make_problem(batch=3, heads_q=4, heads_kv=2, seq_q=70, seq_k=64, head_dim=64), inst_for(lse=lse))[2][
        "status"] == "PASSED"


def _with_extra_key(inp, b, extra_k, extra_v, scale):
    q, k, v = inp.values["q"][b], inp.values["k"][b], inp.values["v"][b]
    return reference_sequence(q, np.concatenate([k, extra_k[:, None]], axis=1),
                              np.concatenate([v, extra_v[:, None]], axis=1), scale, "none")[0]


@pytest.mark.parametrize("layout", [Layout.bshd, Layout.bhsd])
def test_the_extra_key_is_the_row_that_follows_in_memory(layout):
    """Sequence 0's output equals attention over its keys plus the row after them in memory (BSHD: sequence 1's
    first row of the same head; BHSD: the next head's first row, the last head reading sequence 1's head 0) and
    differs from attention with a zero key appended (the old model)."""
    p = make_problem(batch=2, heads_q=2, heads_kv=2, seq_q=40, seq_k=65, head_dim=64, layout=layout.value)
    inst = inst_for(lse=False, layout=layout, gqa=False)
    inp, out, v = run(p, inst)
    got = gather_outputs(inst, p, out)["o"][0]
    k0, k1, v0, v1 = inp.values["k"][0], inp.values["k"][1], inp.values["v"][0], inp.values["v"][1]
    if layout is Layout.bshd:
        nk, nv = k1[:, 0], v1[:, 0]
    else:
        nk, nv = np.stack([k0[1, 0], k1[0, 0]]), np.stack([v0[1, 0], v1[0, 0]])
    scale = p.softmax_scale
    want = _with_extra_key(inp, 0, nk, nv, scale)
    zeros = _with_extra_key(inp, 0, np.zeros_like(nk), np.zeros_like(nv), scale)
    tol = o_tolerance(inst.dtype) * np.abs(want).max()
    assert np.abs(got - want).max() < tol
    assert np.abs(got - zeros).max() > 10 * tol
    # BSHD spares the last sequence (its next row is past the buffer); BHSD's last sequence has one for head 0
    assert v["failed_batches"] == ([0] if layout is Layout.bshd else [0, 1])


def test_varlen_extra_key_is_the_next_sequences_first_row():
    p = make_problem(heads_q=2, heads_kv=1, seqlens_q=(30, 9, 20), seqlens_k=(65, 0, 70), head_dim=64)
    inst = inst_for(lse=False, varlen=True)
    inp, out, v = run(p, inst)
    got = gather_outputs(inst, p, out)["o"][0]
    # sequence 1 is empty: the row after sequence 0's keys is sequence 2's first
    want = _with_extra_key(inp, 0, inp.values["k"][2][:, 0], inp.values["v"][2][:, 0], p.softmax_scale)
    assert np.abs(got - want).max() < o_tolerance(inst.dtype) * np.abs(want).max()
    assert v["failed_batches"] == [0]           # sequence 2 (70 keys, partial tile) has nothing after it


def test_torch_reference_matches_numpy_on_the_cpu():
    """reference(device=...) runs torch float64 (the GPU path of `emitter verify`); on the CPU it must equal
    the numpy reference, -inf rows included."""
    pytest.importorskip("torch")
    for mask in Mask:
        for kw in (dict(batch=2, heads_q=4, heads_kv=2, seq_q=70, seq_k=33, head_dim=64, scale=0.3),
                   dict(heads_q=4, heads_kv=1, seqlens_q=(5, 70, 1), seqlens_k=(9, 65, 0), head_dim=64)):
            p = make_problem(**kw)
            inst = inst_for(mask=mask, varlen=p.varlen)
            inp = make_inputs(inst, p, "large", 5)
            a, b = reference(inst, p, inp), reference(inst, p, inp, device="cpu")
            for x, y in zip(a["o"] + a["lse"], b["o"] + b["lse"]):
                assert np.array_equal(np.isneginf(x), np.isneginf(y))
                np.testing.assert_allclose(np.where(np.isfinite(x), x, 0), np.where(np.isfinite(y), y, 0),
                                           rtol=1e-9, atol=1e-9)


def test_emitter_verify_catches_the_key_tail_on_an_instance_without_lse(tmp_path):
    """`emitter verify --backend fake` on configs/attention/sm80.yaml's BHSD instance (lse: false): clean it
    passes, with the key-tail fault planted every case with a partial last key tile fails on O."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gen"
    cmd = [sys.executable, "-m", "emitter"]
    r = subprocess.run(cmd + ["emit", str(root / "configs" / "attention" / "sm80.yaml"), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    args = cmd + ["verify", str(out), "--backend", "fake", "--select", "*nomask_bhsd", "--data", "normal",
                  "--problem", "b=2,hq=4,hkv=4,sq=70,sk=65,d=64,layout=bhsd"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    faults = json.dumps([{"kind": "key_tail_off_by_one"}])
    r = subprocess.run(args + ["--fake-faults", faults], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((out / "verify" / "results.json").read_text())
    failed = [x for x in res["results"] if x["status"] == "FAILED"]
    assert failed and all(x["reason"].startswith("O: ") and "LSE" not in x["reason"] for x in failed), failed
