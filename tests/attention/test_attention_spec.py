"""Attention family (issue 27): spec parsing, sweeps, exclusions, rejections with reasons (sm80 rules),
naming, and the emit pipeline over configs/attention/sm80.yaml."""

import json
import textwrap

import pytest

from emitter.emit import emit, spec_entries
from emitter.errors import SpecError
from emitter.families import attention as fam
from emitter.families.attention import sm80
from emitter.families.attention.model import Arch, AttentionInstance, Layout, Mask, Rejection, Schedule
from emitter.dtypes import DType
from emitter.resources import configs_root
from emitter.spec.loader import parse_text


def expand(text: str):
    doc = parse_text(textwrap.dedent(text), "spec.yaml")
    out = []
    for path, entry, kp in spec_entries(doc):
        out += [c for c, _ in fam.expand_entry(doc, path, entry, kp)]
    return out


BASE = """\
kernels:
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
"""


def test_minimal_spec_defaults():
    (c,) = expand(BASE)
    assert c == AttentionInstance(Arch.sm80, DType.f16, 64, 64, 64, 64)
    assert (c.mask, c.layout, c.lse, c.gqa, c.varlen, c.key_tail) == (Mask.none, Layout.bshd, False, False, False, True)
    r = fam.resolve(c)
    assert isinstance(r, AttentionInstance) and r.schedule is Schedule.multistage and r.stages == sm80.STAGES
    assert fam.instance_name(r) == "attn_sm80_f16_d64_64x64_multistage_s4_nomask_bshd"


def test_sweeps_are_a_cartesian_product_and_exclude_drops():
    cands = expand(BASE.replace("dtype: f16", "dtype: [f16, bf16]").replace("tile: 64x64", "tile: [64x64, [32, 128]]")
                   + "    mask: [none, causal, bottom_right]\n    lse: [false, true]\n"
                   + "    exclude:\n      - {dtype: bf16, mask: causal_bottom_right}\n")
    assert len(cands) == 2 * 2 * 3 * 2 - 2 * 2     # bf16 x bottom-right x (2 tiles) x (2 lse) dropped
    assert {c.mask for c in cands} == set(Mask)
    assert {(c.tile_q, c.tile_kv) for c in cands} == {(64, 64), (32, 128)}
    names = {fam.instance_name(fam.resolve(c)) for c in cands}
    assert len(names) == len(cands)                  # different configs, different names


def test_head_dim_v_and_defaults_section():
    cands = expand("""\
defaults:
  family: attention
  arch: sm80
  gqa: true
kernels:
  - dtype: bf16
    head_dim: 96
    head_dim_v: 64
    tile: 64x128
""")
    (c,) = cands
    assert (c.head_dim, c.head_dim_v, c.gqa) == (96, 64, True)
    assert fam.instance_name(fam.resolve(c)) == "attn_sm80_bf16_d96v64_64x128_multistage_s4_nomask_bshd_gqa"


@pytest.mark.parametrize("line,key,needle", [
    ("    head_dim: 48\n", "head_dim", "head dim 48 is not allowed"),
    ("    mask: sliding\n", "mask", "unknown value 'sliding'"),
    ("    tile: 64x48\n", "tile", "tile dimension 48"),
    ("    lse: yes\n", "lse", "true or false"),
    ("    dtype: f32\n", "dtype", "not an attention data type"),
    ("    tiles: 64x64\n", "tiles", "unknown key 'tiles'"),
    ("    layout: nhwc\n", "layout", "unknown value 'nhwc'"),
    ("    stages: 0\n", "stages", "out of range"),
])
def test_bad_values_name_file_line_key_value_allowed(line, key, needle):
    text = BASE.replace("    tile: 64x64\n", "") + "    tile: 64x64\n"
    text = text.replace(f"    {key}: " + {"head_dim": "64", "dtype": "f16", "tile": "64x64"}.get(key, "@@") + "\n", "")
    with pytest.raises(SpecError) as ei:
        expand(text + line)
    e = ei.value
    assert needle in e.message
    assert e.file == "spec.yaml" and e.line is not None and e.key_path.endswith(key)
    assert e.allowed is not None or key == "lse"
    assert e.exit_code == 2


def test_missing_required_key():
    with pytest.raises(SpecError, match="missing required key 'tile'"):
        expand(BASE.replace("    tile: 64x64\n", ""))


def test_attention_entry_needs_family():
    doc = parse_text(textwrap.dedent(BASE), "spec.yaml")
    entry = dict(doc.data["kernels"][0], family="gemm")
    with pytest.raises(SpecError, match="family: attention"):
        list(fam.expand_entry(doc, ("kernels", 0), entry, {}))


def rejection(**kw) -> Rejection:
    base = dict(arch=Arch.sm80, dtype=DType.f16, head_dim=64, head_dim_v=64, tile_q=64, tile_kv=64)
    base.update(kw)
    r = fam.resolve(AttentionInstance(**base))
    assert isinstance(r, Rejection), r
    return r


@pytest.mark.parametrize("kw,rule,needle", [
    ({"dtype": DType.e4m3}, "dtype-arch", "fp8 attention is sm90a"),
    ({"tile_kv": 256}, "tile-kv", "tile_kv <= 128"),
    ({"tile_q": 256}, "tile-q", "use 32, 64, 128"),
    ({"tile_q": 96}, "tile-q", "multiple of 32"),
    ({"schedule": Schedule.pingpong}, "schedule-arch", "Hopper"),
    ({"persistent": True}, "persistent-arch", "persistent"),
    ({"stages": 3}, "stages-fixed", "4 stages"),
    ({"key_tail": False}, "key-tail-always", "key_tail true"),
])
def test_sm80_rejections_name_rule_and_fix(kw, rule, needle):
    r = rejection(**kw)
    assert r.rule == rule and needle in r.reason, r


def test_shared_memory_budget_rejects_with_the_number(monkeypatch):
    # every sm80 tile fits 163 KB (the largest, 128x128 at d256, needs 106,496 bytes); check the rule itself
    # against a smaller budget and the exact number in its reason
    inst = AttentionInstance(Arch.sm80, DType.f16, 256, 256, 128, 128)
    assert sm80.smem_bytes(inst) == 106496
    assert isinstance(fam.resolve(inst), AttentionInstance)
    monkeypatch.setitem(sm80.SMEM_LIMIT, Arch.sm80, 100000)
    r = fam.resolve(inst)
    assert isinstance(r, Rejection) and r.rule == "smem-budget"
    assert "106496 bytes" in r.reason and "100000" in r.reason


def test_sm80_shared_memory_model_shape():
    # multi-pass (head dim above tile_kv) never needs less than single-pass; bigger tiles need more
    for tq in sm80.TILE_Q:
        for tkv in sm80.TILE_KV:
            one = sm80.smem_bytes(AttentionInstance(Arch.sm80, DType.f16, 64, 64, tq, tkv))
            multi = sm80.smem_bytes(AttentionInstance(Arch.sm80, DType.f16, 256, 256, tq, tkv))
            assert 0 < one <= multi <= sm80.SMEM_LIMIT[Arch.sm80]


def test_sm90a_dispatch_is_lazy_and_named():
    # sm90a instances resolve in attention/sm90a.py (the Hopper engineer's); emitting one never needs sm80.py
    c = AttentionInstance(Arch.sm90a, DType.f16, 128, 128, 128, 128)
    r = fam.resolve(c)
    assert isinstance(r, (AttentionInstance, Rejection))


def test_config_roundtrip():
    r = fam.resolve(AttentionInstance(Arch.sm80, DType.bf16, 96, 64, 64, 128, mask=Mask.causal_bottom_right,
                                      lse=True, gqa=True, varlen=True, layout=Layout.bhsd))
    cfg = json.loads(json.dumps(r.config()))
    assert AttentionInstance.from_config(cfg) == r


def test_emit_starter_config(tmp_path):
    spec = configs_root() / "attention" / "sm80.yaml"
    res = emit([spec], tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    entries = manifest["instances"]
    assert len(entries) >= 12 and not manifest.get("rejected")
    assert all(e["family"] == "attention" and e["arch"] == "sm80" for e in entries)
    cfgs = [e["config"] for e in entries]
    assert {c["mask"] for c in cfgs} == {"none", "causal_top_left", "causal_bottom_right"}
    assert any(c["varlen"] for c in cfgs) and any(c["layout"] == "bhsd" for c in cfgs)
    assert any(c["head_dim"] == 256 for c in cfgs) and any(c["head_dim_v"] != c["head_dim"] for c in cfgs)
    for e in entries:
        text = (tmp_path / e["source"]).read_text()
        assert f"emitter_{e['name']}_kernel" in text
    assert res is not None


def test_huge_sweep_is_refused_before_expanding():
    from emitter.spec.sweep import sweep_limit

    text = BASE.replace("head_dim: 64", "head_dim: [32, 64, 96, 128, 256]").replace("dtype: f16", "dtype: [f16, bf16]")
    text += "    mask: [none, causal, bottom_right]\n    lse: [true, false]\n    gqa: [true, false]\n    varlen: [true, false]\n"
    with sweep_limit(100), pytest.raises(SpecError, match="sweeps 240 combinations") as ei:
        expand(text)
    assert ei.value.line is not None
