"""Attention backward (op: backward) without a GPU: the spec's op axis and its rules, names, rejections before
nvcc, the rendered levels, the ABI mirror, verify through the fake backend (computed independently of the
reference) on every instance of configs/attention/sm80_backward.yaml, and the planted faults each caught for
its reason. The nvcc-marked test compiles one real sm80 backward instance (device cubin and host shim)."""

import ctypes
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from emitter.dtypes import DType
from emitter.emit import emit, spec_entries
from emitter.errors import SpecError
from emitter.families import attention as fam
from emitter.families.attention import backward_sm80, runtime as rt
from emitter.families.attention.backward_abi import EmitterAttentionBackwardProblem
from emitter.families.attention.backward_model import AttentionBackwardInstance
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask, Rejection
from emitter.families.attention.problem import make_problem
from emitter.resources import configs_root
from emitter.spec.loader import parse_text

CONFIG = configs_root() / "attention" / "sm80_backward.yaml"


def expand(text: str):
    doc = parse_text(textwrap.dedent(text), "spec.yaml")
    out = []
    for path, entry, kp in spec_entries(doc):
        out += [c for c, _ in fam.expand_entry(doc, path, entry, kp)]
    return out


BASE = """\
kernels:
  - family: attention
    op: backward
    arch: sm80
    dtype: bf16
    head_dim: 128
    tile: 128x128
"""


def test_backward_defaults_and_name():
    (c,) = expand(BASE)
    assert c == AttentionBackwardInstance(Arch.sm80, DType.bf16, 128, 128, 128, 128)
    assert (c.mask, c.layout, c.gqa, c.varlen, c.deterministic) == (Mask.none, Layout.bshd, False, False, True)
    r = fam.resolve(c)
    assert r == c
    assert fam.instance_name(r) == "attn_bwd_sm80_bf16_d128_128x128_nomask_bshd_det"
    assert r.config()["op"] == "backward"
    assert AttentionBackwardInstance.from_config(r.config()) == r


def test_op_forward_gives_the_forward_instances_unchanged():
    fwd_text = BASE.replace("    op: backward\n", "").replace("dtype: bf16", "dtype: f16").replace("tile: 128x128", "tile: 64x64")
    plain = expand(fwd_text)
    with_op = expand(fwd_text.replace("family: attention\n", "family: attention\n    op: forward\n"))
    assert plain == with_op and all(isinstance(c, AttentionInstance) for c in plain)
    both = expand(fwd_text.replace("family: attention\n", "family: attention\n    op: [forward, backward]\n"))
    assert [type(c).__name__ for c in both] == ["AttentionInstance", "AttentionBackwardInstance"]
    assert both[0] == plain[0]


def test_op_sweep_with_exclude_on_op():
    cands = expand(BASE.replace("op: backward", "op: [forward, backward]").replace("head_dim: 128", "head_dim: [64, 128]")
                   + "    exclude:\n      - {op: forward, head_dim: 128}\n")
    kinds = sorted((type(c).__name__, c.head_dim) for c in cands)
    assert kinds == [("AttentionBackwardInstance", 64), ("AttentionBackwardInstance", 128), ("AttentionInstance", 64)]


@pytest.mark.parametrize("extra, where, words", [
    ("    lse: true\n", "lse", "forward-only"),
    ("    key_tail: false\n", "key_tail", "forward-only"),
    ("    stages: 3\n", "stages", "forward-only"),
    ("    op: sideways\n", "op", "not an attention op"),
])
def test_backward_rejects_forward_keys_and_bad_ops(extra, where, words):
    text = BASE + extra if "op:" not in extra else BASE.replace("    op: backward\n", extra)
    with pytest.raises(SpecError) as e:
        expand(text)
    msg = e.value.render()
    assert words in msg and where in msg and "spec.yaml" in msg


def test_mixed_ops_refuse_op_specific_keys_with_the_fix():
    with pytest.raises(SpecError) as e:
        expand(BASE.replace("op: backward", "op: [forward, backward]") + "    deterministic: false\n")
    assert "split the entry" in e.value.render()
    with pytest.raises(SpecError) as e:
        expand(BASE.replace("op: backward", "op: forward") + "    deterministic: false\n")
    assert "backward-only" in e.value.render()


@pytest.mark.parametrize("change, rule", [
    (dict(dtype=DType.e4m3), "backward-dtype"),
    (dict(head_dim=256, head_dim_v=128), "backward-head-dim-v"),
    (dict(tile_q=32), "backward-tile-q"),
    (dict(tile_kv=256), "backward-tile-kv"),
    (dict(arch=Arch.sm90a, dtype=DType.f32), "sm90a-backward-dtype"),   # sm90a: f16 / bf16 only
])
def test_rejections_name_the_rule(change, rule):
    inst = AttentionBackwardInstance(Arch.sm80, DType.bf16, 128, 128, 128, 128).replace(**change)
    r = fam.resolve(inst)
    assert isinstance(r, Rejection) and r.rule == rule and r.reason


def test_every_accepted_combination_has_a_smem_model():
    for dt in backward_sm80.DTYPES:
        for d in backward_sm80.HEAD_DIMS:
            for tq in backward_sm80.TILE_Q:
                for tkv in backward_sm80.TILE_KV:
                    r = backward_sm80.resolve(AttentionBackwardInstance(Arch.sm80, dt, d, d, tq, tkv))
                    assert isinstance(r, AttentionBackwardInstance), r
                    assert backward_sm80.smem_bytes(r) <= backward_sm80.SMEM_LIMIT


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    out = tmp_path_factory.mktemp("bwd")
    emit([str(CONFIG)], out)
    return out, json.loads((out / "manifest.json").read_text())


def test_config_emits_and_renders_each_level(emitted):
    out, manifest = emitted
    names = [e["name"] for e in manifest["instances"] if e["config"].get("op") == "backward"]
    assert len(names) == 16 and not manifest["rejected"] and all(n.startswith("attn_bwd_sm80_") for n in names)
    # the forward the GPU test's training step pairs with: an op: forward entry, named as forward instances are
    assert [e["name"] for e in manifest["instances"] if "op" not in e["config"]] == \
        ["attn_sm80_bf16_d64_64x64_multistage_s4_causaltl_bshd_lse_gqa"]
    text = (out / f"{names[0]}.cu").read_text()
    for level in backward_sm80.LEVELS:
        assert f": {level} --" in text
    assert '#include "../examples/41_fused_multi_head_attention/kernel_backward.h"' in text
    assert "AttentionBackwardKernel<cutlass::arch::Sm80, Element" in text


def test_abi_mirror_matches_the_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    from emitter.render import templates_root
    header = templates_root() / "attention" / "common" / "attention_backward_abi.h"
    fields = [f for f, _ in EmitterAttentionBackwardProblem._fields_]
    src = tmp_path / "abi.c"
    src.write_text(f'#include <stdio.h>\n#include <stddef.h>\n#include "{header}"\nint main(void) {{\n'
                   f'  printf("%zu\\n", sizeof(emitter_attention_backward_problem));\n'
                   + "".join(f'  printf("%zu\\n", offsetof(emitter_attention_backward_problem, {f}));\n' for f in fields)
                   + "  return 0;\n}\n")
    subprocess.run([cc, str(src), "-o", str(tmp_path / "abi")], check=True)
    got = [int(x) for x in subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True, check=True).stdout.split()]
    assert got == [ctypes.sizeof(EmitterAttentionBackwardProblem)] + [getattr(EmitterAttentionBackwardProblem, f).offset
                                                                      for f in fields]


def test_library_records_take_each_op_to_its_own_table(emitted):
    from emitter.families.attention.backward_library import backward_records
    from emitter.families.attention.library import kernel_records
    from emitter.kit.library import LibraryError

    out, manifest = emitted
    entry = next(e for e in manifest["instances"] if e["config"].get("op") == "backward")
    (rec,) = backward_records([entry], {"f16": 1, "bf16": 2}, LibraryError)
    assert rec.name == entry["name"] and rec.inst == AttentionBackwardInstance.from_config(entry["config"])
    with pytest.raises(LibraryError, match="backward instance"):
        kernel_records([entry], {"f16": 1, "bf16": 2}, LibraryError)


def _case(root, entry, p, data="normal", faults=(), seed=3):
    from emitter.runtime.fake_backend import FakeBackend

    be = FakeBackend(faults=list(faults))
    k = be.load(root, entry)
    inp = rt.make_inputs(k.config, p, data, seed)
    res = be.run(k, p, inp)
    return rt.compare(k.config, p, inp, res.outputs, rt.reference(k.config, p, inp))


def test_fake_backend_passes_every_instance_on_its_default_problems(emitted):
    out, manifest = emitted
    seen = set()
    for entry in manifest["instances"]:
        if entry["config"].get("op") != "backward":
            continue
        cfg = rt.config_from_entry(entry)
        for i, (p, data) in enumerate(rt.default_problems(cfg, quick=True)):
            assert not rt.not_supported_reasons(cfg, p)
            v = _case(out, entry, p, data, seed=i)
            assert v["status"] == "PASSED", (entry["name"], p.label(), data, v["reason"])
            seen.add((cfg.mask.value, p.varlen, p.heads_kv < p.heads_q, p.pad > 0, data))
    assert {m for m, *_ in seen} == {"none", "causal_top_left", "causal_bottom_right"}
    assert any(s[1] for s in seen) and any(s[2] for s in seen) and any(s[3] for s in seen)
    assert {s[4] for s in seen} == {"normal", "int", "large"}


def test_planted_faults_are_caught_for_their_reasons(emitted):
    out, manifest = emitted
    entry = next(e for e in manifest["instances"] if e["name"] == "attn_bwd_sm80_bf16_d128_128x128_causaltl_bshd_gqa_det")
    p = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=77, seq_k=78, head_dim=128, scale=0.3)
    assert _case(out, entry, p)["status"] == "PASSED"
    v = _case(out, entry, p, faults=[{"kind": "bwd_wrong_kv_head"}])
    assert v["failed_tensors"] == ["dk"] and v["failed_heads"]["dk"] == [0, 1], v["reason"]
    v = _case(out, entry, p, faults=[{"kind": "bwd_no_scale_ds"}])
    assert v["failed_tensors"] == ["dq", "dk"], v["reason"]           # dV = P^T dO has no dS in it
    v = _case(out, entry, p, faults=[{"kind": "bwd_mask_off_by_one"}])
    assert v["status"] == "FAILED" and v["failed_full_rows"] == 0 and v["unseen_key_rows"] > 0, v["reason"]
    long = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=200, seq_k=201, head_dim=128)
    v = _case(out, entry, long, faults=[{"kind": "bwd_drop_dq_partial"}])
    assert v["failed_tensors"] == ["dq"], v["reason"]
    # a plan naming a forward fault too (a mixed manifest): the backward ignores it, the forward instance gets it
    assert _case(out, entry, p, faults=[{"kind": "no_mask"}])["status"] == "PASSED"
    fwd = rt.config_from_entry(next(e for e in manifest["instances"] if e["config"].get("op") != "backward"))
    p64 = make_problem(batch=1, heads_q=8, heads_kv=2, seq_q=33, seq_k=40, head_dim=64)
    assert rt.fake_run(fwd, p64, rt.make_inputs(fwd, p64, "normal", 1).buffers, {"bwd_no_scale_ds": {}})["o"].size
    # a fault that cannot show: one KV head has no other head to be confused with
    mqa = make_problem(batch=1, heads_q=4, heads_kv=1, seq_q=40, seq_k=41, head_dim=128)
    assert _case(out, entry, mqa, faults=[{"kind": "bwd_wrong_kv_head"}])["status"] == "PASSED"


def test_reference_autograd_matches_closed_form():
    import numpy as np

    from emitter.families.attention.backward_runtime import _grads_numpy, _grads_torch

    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for mask in ("none", "causal_top_left", "causal_bottom_right"):
        q, k, v = rng.standard_normal((4, 9, 8)), rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
        do = rng.standard_normal((4, 9, 8))
        for a, b in zip(_grads_torch(q, k, v, do, 0.3, mask, None), _grads_numpy(q, k, v, do, 0.3, mask)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.nvcc
def test_one_backward_instance_compiles(emitted, tmp_path):
    """A real sm80 backward instance through the project's build (device fatbin and host shim): the shared
    memory, thread and register-residency models are static_asserts in it."""
    from emitter.build import BuildOptions, build
    from emitter.manifest import load, write

    out, _ = emitted
    data = load(out)
    data["instances"] = [e for e in data["instances"] if e["name"] == "attn_bwd_sm80_f16_d64_64x64_causalbr_bhsd_gqa"]
    write(out, data)
    summary = build(out, options=BuildOptions())
    (r,) = summary.results
    assert r.status in ("ok", "cached"), r.error
    _host_shim_answers(out, data["instances"][0])


def _host_shim_answers(root, entry):
    """The built host shim's can-implement, launch shape and workspace through ctypes (no GPU needed: query
    reads no device memory; without a device the key-split count assumes 132 SMs)."""
    import dataclasses

    from emitter.kit.shim import HostShim

    name = entry["name"]
    cfg = rt.config_from_entry(entry)
    shim = HostShim(root / "build" / name / f"lib{name}.so", name)
    ok = make_problem(batch=2, heads_q=8, heads_kv=2, seq_q=130, seq_k=300, head_dim=64, layout="bhsd")
    status, launch = shim.query(rt.c_problem(cfg, ok, {}))
    assert status == 0
    key_blocks = -(-300 // cfg.tile_kv)
    assert 1 <= launch.grid[0] <= key_blocks and tuple(launch.grid)[1:] == (8, 2)     # (splits, heads_q, batch)
    assert tuple(launch.block) == (backward_sm80.threads(cfg.instance), 1, 1)
    assert launch.shared_bytes == backward_sm80.smem_bytes(cfg.instance)
    # delta and LSE rows (seq_q rounded up to 32) of every (batch, head), the per-query-head dK / dV of the group sum
    rows = 2 * 8 * 160
    assert launch.workspace_bytes >= 2 * rows * 4 + 2 * (2 * 8 * 300 * 64 * 2)

    def status_of(p, **fields):
        c = rt.c_problem(cfg, p, {})
        for k, v in fields.items():
            if isinstance(v, tuple):
                arr = getattr(c, k)
                for i, x in enumerate(v):
                    arr[i] = x
            else:
                setattr(c, k, v)
        return shim.query(c)[0]

    assert status_of(ok, head_dim=128) == 1                       # compiled for d64: cannot implement
    assert status_of(ok, heads_kv=3) == 2                         # 3 does not divide 8: invalid
    assert status_of(ok, stride_q=(0, 68, 0)) == 1                # a row stride off the 16-byte vector
    assert status_of(ok, stride_dq=(0, 96, 0)) == 1               # gradient rows not n x head_dim
    assert status_of(ok, flags=1) == 1
    assert status_of(ok, scale=-1.0) == 2
    assert status_of(dataclasses.replace(ok, heads_kv=8)) == 0    # no group: dK / dV written directly
    varlen = make_problem(heads_q=8, heads_kv=2, seqlens_q=(5, 70), seqlens_k=(9, 0), head_dim=64, layout="bhsd")
    assert status_of(varlen) == 1                                 # not a varlen instance


def test_every_backward_point_resolves_and_renders_or_is_rejected_with_a_rule():
    """Accepted means renderable: a random backward spec point either resolves to an instance that renders and
    names cleanly (its shared-memory model known) or is a Rejection with a rule and a reason -- never an error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from emitter.families.attention.spec import TILE_SIZES
    from emitter.families.attention.model import HEAD_DIMS
    from emitter.render import banner

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(arch=st.sampled_from(list(Arch)), dtype=st.sampled_from([DType.f16, DType.bf16, DType.e4m3]),
           d=st.sampled_from(HEAD_DIMS), dv=st.sampled_from(HEAD_DIMS), tq=st.sampled_from(TILE_SIZES),
           tkv=st.sampled_from(TILE_SIZES), mask=st.sampled_from(list(Mask)), layout=st.sampled_from(list(Layout)),
           gqa=st.booleans(), varlen=st.booleans(), det=st.booleans())
    def prop(arch, dtype, d, dv, tq, tkv, mask, layout, gqa, varlen, det):
        inst = AttentionBackwardInstance(arch, dtype, d, dv, tq, tkv, mask, layout, gqa, varlen, det)
        r = fam.resolve(inst)
        if isinstance(r, Rejection):
            assert r.rule and r.reason
            return
        name = fam.instance_name(r)
        assert name.startswith("attn_bwd_") and name == name.lower()
        text = fam.render_instance(r, name, banner("spec.yaml", "0" * 64))
        assert f"emitter_{name}_kernel" in text
        if r.arch is Arch.sm80:
            assert str(backward_sm80.smem_bytes(r)) in text

    prop()


def test_profile_files_backward_instances_under_their_own_op(emitted):
    """`emitter profile` over a manifest with backward instances: each gets its own op (JSON round trip); a
    profile problem of its head dims and mask applies to it, one of other head dims does not
    (tests/attention/test_attention_backward_profile.py profiles them)."""
    from emitter.families.attention.profile import AttentionProfileProblem

    out, manifest = emitted
    cfg = rt.config_from_entry(next(e for e in manifest["instances"] if e["config"].get("op") == "backward"))
    op = rt.profile_op(cfg)
    assert op.key.startswith("attnbwd_") and rt.profile_op_from_json(op.to_json()) == op
    problem = AttentionProfileProblem(1, 8, 2, 128, 128, cfg.head_dim, cfg.head_dim_v, causal=cfg.causal)
    assert rt.profile_applies(op, problem) is True
    other = AttentionProfileProblem(1, 8, 2, 128, 128, 2 * cfg.head_dim, 2 * cfg.head_dim_v, causal=cfg.causal)
    assert rt.profile_applies(op, other) is False
    fwd = rt.config_from_entry(next(e for e in manifest["instances"] if e["config"].get("op") != "backward"))
    assert rt.profile_applies(rt.profile_op(fwd), AttentionProfileProblem(1, 8, 2, 128, 128, 64, 64, causal=True))
