"""Attention sm80 on the GPU (issue 27): configs/attention/sm80.yaml emitted and built the user's way, every
instance verified on its default problems by emitter/families/attention/runner.py (GQA and MQA, varlen with an
empty sequence, both causal alignments with seq_q != seq_k, key tails, LSE, a run-time scale, large-magnitude
inputs), and planted bugs (wrong scale, missing mask, key-tail off by one, wrong KV head) each caught for its
reason, not merely FAILED.

    source .device-wheels/setup.sh; python3 -m pytest -q -m gpu tests/attention/test_attention_gpu.py
EMITTER_ATTN_DIR=<dir> reuses (or keeps) the emitted and built directory; EMITTER_GPU_REPORTS=<dir> writes the
verdicts as JSON there.
"""

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "attention" / "sm80.yaml"

# (kind, base instance name, [(exact text, replacement)])
PLANTS = [
    ("wrong_scale", "attn_sm80_f16_d128_32x128_multistage_s4_nomask_bshd_lse_gqa",
     [("P.scale = p->scale != 0.f ? p->scale : float(1.0 / std::sqrt(double(kHeadDim)));",
       "P.scale = float(1.0 / std::sqrt(double(kHeadDim)));")]),
    ("no_mask", "attn_sm80_f16_d128_32x128_multistage_s4_causaltl_bshd_lse_gqa",
     [("  if (kCausal) {\n    p.custom_mask_type", "  if (false) {\n    p.custom_mask_type")]),
    # one key too many for every sequence but the last (whose next row would be past the buffer)
    ("key_tail_off_by_one", "attn_sm80_f16_d64_64x64_multistage_s4_nomask_bshd_lse_gqa",
     [("  p.num_keys = w.seq_k;\n", "  p.num_keys = w.seq_k + (int32_t(blockIdx.z) + 1 < int32_t(gridDim.z) ? 1 : 0);\n")]),
    # the same on the instance without LSE: only O can show it
    ("key_tail_off_by_one_nolse", "attn_sm80_f16_d64_64x64_multistage_s4_nomask_bhsd",
     [("  p.num_keys = w.seq_k;\n", "  p.num_keys = w.seq_k + (int32_t(blockIdx.z) + 1 < int32_t(gridDim.z) ? 1 : 0);\n")]),
    ("wrong_kv_head", "attn_sm80_f16_d64_64x64_multistage_s4_nomask_bshd_lse_gqa",
     [("  w.kv_head = w.head / P.group;", "  w.kv_head = w.head % (P.heads_q / P.group);")]),
]


def plant_bugs(root: Path, real: list[dict]) -> list[dict]:
    by_name = {e["name"]: e for e in real}
    planted = []
    for kind, base_name, edits in PLANTS:
        base = by_name[base_name]
        text = (root / base["source"]).read_text()
        for old, new in edits:
            assert old in text, f"planting {kind}: {base_name}.cu no longer contains {old!r}"
            text = text.replace(old, new, 1)
        name = f"{base_name}_bug_{kind}"
        text = text.replace(base_name, name)
        (root / f"{name}.cu").write_text(text)
        planted.append({**base, "name": name, "source": f"{name}.cu", "planted": kind})
    return planted


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    from emitter.build import BuildOptions, build
    from emitter.emit import emit
    from emitter.manifest import load, write

    root = Path(os.environ.get("EMITTER_ATTN_DIR") or tmp_path_factory.mktemp("attn_gpu"))
    if not (root / "manifest.json").is_file():
        emit([str(CONFIG)], root)
    data = load(root)
    real = [e for e in data["instances"] if "planted" not in e]
    planted = plant_bugs(root, real)
    data["instances"] = real + planted
    write(root, data)
    summary = build(root, options=BuildOptions())
    records = {r.name: r for r in summary.results}
    from emitter.families.attention.runner import Runner
    from emitter.runtime.pycuda_backend import PycudaBackend

    # numpy float64 references here (the quick problems are small); `emitter verify` uses torch's on the GPU,
    # which test_torch_reference_matches_numpy checks against this one
    runner = Runner(root, PycudaBackend(device_reference=False))
    return root, real, {p["planted"]: p for p in planted}, records, runner


def _report(name: str, verdicts) -> None:
    d = os.environ.get("EMITTER_GPU_REPORTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        (Path(d) / f"attention_{name}.json").write_text(json.dumps(verdicts, indent=1, default=str))


def test_every_instance_builds(suite):
    root, real, planted, records, _ = suite
    failed = {n: (r.error or "")[:1500] for n, r in records.items() if r.status == "failed"}
    assert not failed, json.dumps(failed, indent=1)


def test_default_problems_pass_on_every_instance(suite):
    from emitter.families.attention import runtime as hooks
    from emitter.families.attention.runner import line

    root, real, planted, records, runner = suite
    verdicts = []
    for entry in real:
        cfg = hooks.config_from_entry(entry, root)
        for i, (p, data) in enumerate(hooks.default_problems(cfg, quick=True)):   # `emitter verify` runs the large ones
            v = runner.run_case(entry, p, data, seed=100 + i)
            v["config"] = entry["config"]
            v["problem_obj"] = p.to_dict()
            verdicts.append(v)
            print(line(v))
    _report("default", verdicts)
    bad = [line(v) for v in verdicts if v["status"] != "PASSED"]
    assert not bad, "\n".join(bad)

    def seen(pred):
        return any(pred(v["config"], v["problem_obj"], v) for v in verdicts if v["status"] == "PASSED")

    # every feature the issue requires on sm80 was exercised and passed
    assert seen(lambda c, p, v: p["heads_kv"] < p["heads_q"]), "GQA"
    assert seen(lambda c, p, v: p["heads_kv"] == 1 and p["heads_q"] > 1), "MQA"
    assert seen(lambda c, p, v: p["seqlens_q"] is not None and 0 in p["seqlens_k"]), "varlen with an empty sequence"
    for mask in ("causal_top_left", "causal_bottom_right"):
        assert seen(lambda c, p, v: c["mask"] == mask and p["seq_q"] > p["seq_k"]), f"{mask} with seq_q > seq_k"
        assert seen(lambda c, p, v: c["mask"] == mask and p["seq_q"] < p["seq_k"]), f"{mask} with seq_q < seq_k"
    assert seen(lambda c, p, v: p["seq_k"] % c["tile_kv"] != 0), "key tail"
    assert seen(lambda c, p, v: c["lse"] and v.get("lse_max_abs_err") is not None), "LSE"
    assert seen(lambda c, p, v: p["scale"] not in (0.0,)), "run-time scale"
    assert seen(lambda c, p, v: "_large" in v["label"]), "large magnitudes"
    assert seen(lambda c, p, v: c["head_dim"] == 256), "d256 (multi-pass, workspace)"
    assert seen(lambda c, p, v: c["layout"] == "bhsd"), "BHSD"
    assert seen(lambda c, p, v: p["pad"] > 0 and v["stray_writes"] == 0), "padded rows, no stray writes"


def _run(suite, kind: str, **problem):
    from emitter.families.attention.problem import make_problem
    from emitter.families.attention.runner import line

    root, real, planted, records, runner = suite
    entry = planted[kind]
    assert records[entry["name"]].status != "failed", f"the planted {kind} variant must build"
    v = runner.run_case(entry, make_problem(**problem), "normal", seed=7)
    print(line(v))
    return v


def _base(suite, kind: str, **problem):
    from emitter.families.attention.problem import make_problem

    root, real, planted, records, runner = suite
    base = next(e for e in real if e["name"] == planted[kind]["name"].split("_bug_")[0])
    return runner.run_case(base, make_problem(**problem), "normal", seed=7)


def test_planted_wrong_scale(suite):
    prob = dict(batch=2, heads_q=8, heads_kv=2, seq_q=100, seq_k=130, head_dim=128, scale=0.3)
    assert _base(suite, "wrong_scale", **prob)["status"] == "PASSED"
    v = _run(suite, "wrong_scale", **prob)
    # every row of every head is off, and the LSE with it
    assert v["status"] == "FAILED" and v["lse_failed"], v
    assert v["failed_heads"] == list(range(8)) and v["failed_rows"] == 2 * 100
    # the default scale is 1/sqrt(d): the bug cannot show there
    assert _run(suite, "wrong_scale", **{**prob, "scale": 0.0})["status"] == "PASSED"


def test_planted_missing_mask(suite):
    prob = dict(batch=1, heads_q=8, heads_kv=2, seq_q=100, seq_k=100, head_dim=128)
    assert _base(suite, "no_mask", **prob)["status"] == "PASSED"
    v = _run(suite, "no_mask", **prob)
    # only rows whose keys the causal mask partly hides fail (the last row sees every key either way)
    assert v["status"] == "FAILED" and v["failed_masked_rows"] > 0 and v["failed_full_rows"] == 0, v
    assert v["lse_high_rows"] > 0 and v["lse_low_rows"] == 0       # more keys: more probability mass


def test_planted_key_tail_off_by_one(suite):
    prob = dict(batch=2, heads_q=8, heads_kv=2, seq_q=70, seq_k=65, head_dim=64)
    assert _base(suite, "key_tail_off_by_one", **prob)["status"] == "PASSED"
    v = _run(suite, "key_tail_off_by_one", **prob)
    # the first sequence sees one key past its end (the second sequence's first row): every row of every head
    # is off, its LSE rises; the last sequence is untouched
    assert v["status"] == "FAILED" and v["failed_batches"] == [0], v
    assert v["failed_heads"] == list(range(8)) and v["failed_rows"] == 70 and v["failed_masked_rows"] == 0, v
    assert v["lse_high_rows"] > 8 * 70 // 2 and v["lse_low_rows"] == 0, v     # an extra key only adds mass


def test_planted_key_tail_off_by_one_without_lse(suite):
    """An instance with `lse: false`: the extra key (batch 0, head h reads head h+1's first row in BHSD) shows
    in O alone, in every row of the first sequence."""
    prob = dict(batch=2, heads_q=8, heads_kv=8, seq_q=70, seq_k=65, head_dim=64, layout="bhsd")
    assert _base(suite, "key_tail_off_by_one_nolse", **prob)["status"] == "PASSED"
    v = _run(suite, "key_tail_off_by_one_nolse", **prob)
    assert v["status"] == "FAILED" and v["failed_batches"] == [0] and not v["lse_failed"], v
    assert v["failed_heads"] == list(range(8)) and v["failed_rows"] == 70, v
    assert v["reason"].startswith("O: ") and v["unwritten"] == 0, v["reason"]


def test_planted_wrong_kv_head(suite):
    prob = dict(batch=1, heads_q=8, heads_kv=2, seq_q=77, seq_k=77, head_dim=64)
    assert _base(suite, "wrong_kv_head", **prob)["status"] == "PASSED"
    v = _run(suite, "wrong_kv_head", **prob)
    # h % 2 instead of h // 4: exactly the heads where the two differ fail
    assert v["status"] == "FAILED" and v["failed_heads"] == [h for h in range(8) if h // 4 != h % 2], v
    # without groups (heads_kv = heads_q) there is nothing to confuse
    assert _run(suite, "wrong_kv_head", **{**prob, "heads_kv": 8})["status"] == "PASSED"


def test_matches_torch_sdpa(suite):
    """A third opinion: the kernel's output against torch's own SDPA (math backend, float64) on the same
    inputs, GQA heads repeated, causal from the top left (torch's is_causal alignment)."""
    torch = pytest.importorskip("torch")
    from emitter.families.attention.inputs import gather_outputs
    from emitter.families.attention.problem import make_problem
    from emitter.families.attention import runtime as hooks

    root, real, planted, records, runner = suite
    entry = next(e for e in real if e["name"] == "attn_sm80_f16_d128_32x128_multistage_s4_causaltl_bshd_lse_gqa")
    p = make_problem(batch=2, heads_q=8, heads_kv=2, seq_q=300, seq_k=300, head_dim=128, scale=0.05)
    v = runner.run_case(entry, p, "normal", seed=11, keep=True)
    assert v["status"] == "PASSED", v.get("reason")
    cfg = hooks.config_from_entry(entry, root)
    got = gather_outputs(cfg, p, v["outputs"])["o"]
    for b in range(p.batch):
        q = torch.tensor(v["inputs"].values["q"][b], dtype=torch.float64)
        k = torch.tensor(v["inputs"].values["k"][b], dtype=torch.float64).repeat_interleave(4, dim=0)
        vv = torch.tensor(v["inputs"].values["v"][b], dtype=torch.float64).repeat_interleave(4, dim=0)
        want = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], vv[None], is_causal=True,
                                                                scale=0.05)[0].numpy()
        err = abs(got[b] - want).max() / abs(want).max()
        assert err < 5e-3, (b, err)


def test_torch_reference_matches_numpy():
    """reference(device="cuda") (what `emitter verify` uses on the GPU machine) equals the numpy one."""
    pytest.importorskip("torch")
    import numpy as np

    from emitter.dtypes import DType
    from emitter.families.attention import sm80
    from emitter.families.attention.inputs import make_inputs
    from emitter.families.attention.model import Arch, AttentionInstance, Mask
    from emitter.families.attention.problem import make_problem
    from emitter.families.attention.reference import reference

    for mask in Mask:
        for kw in (dict(batch=2, heads_q=4, heads_kv=2, seq_q=70, seq_k=33, head_dim=64, scale=0.3),
                   dict(heads_q=4, heads_kv=1, seqlens_q=(5, 70, 1), seqlens_k=(9, 65, 0), head_dim=64)):
            p = make_problem(**kw)
            inst = sm80.resolve(AttentionInstance(Arch.sm80, DType.f16, 64, 64, 64, 64, mask=mask, lse=True,
                                                  gqa=True, varlen=p.varlen))
            inp = make_inputs(inst, p, "large", 5)
            a, b = reference(inst, p, inp), reference(inst, p, inp, device="cuda")
            for x, y in zip(a["o"] + a["lse"], b["o"] + b["lse"]):
                assert np.array_equal(np.isneginf(x), np.isneginf(y))
                np.testing.assert_allclose(np.where(np.isfinite(x), x, 0), np.where(np.isfinite(y), y, 0),
                                           rtol=1e-9, atol=1e-9)
