"""Conv family (issue 28): spec parsing, sweeps, exclusions, rejections with a rule and a fix, error messages."""

import textwrap
from pathlib import Path

import pytest

from emitter.dtypes import DType
from emitter.emit import resolve_specs, spec_entries
from emitter.errors import SpecError
from emitter.families.base import Rejection
from emitter.families.conv import instance_name, resolve
from emitter.families.conv.model import ConvOp, IteratorAlgorithm, Layout, Shape3, SplitK, StrideSupport
from emitter.families.conv.spec import expand_entry
from emitter.spec.loader import load_file, parse_text

ROOT = Path(__file__).resolve().parents[2]


def expand_text(text: str, file: str = "t.yaml"):
    doc = parse_text(textwrap.dedent(text), file)
    out = []
    for path, entry, key_paths in spec_entries(doc):
        out += [inst for inst, _ in expand_entry(doc, path, entry, key_paths)]
    return out


def one(text: str):
    (inst,) = expand_text(text)
    return resolve(inst)


SM80 = "family: conv\narch: sm80\nop: fprop\ndtype: f16\ntile: 128x128x64\nwarp: 64x64x64\n"
SM90 = "family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\n"


def test_configs_resolve_without_rejections():
    resolved, rejected, _specs, _dups = resolve_specs(sorted((ROOT / "configs" / "conv").glob("*.yaml")))
    assert len(resolved) >= 12
    assert rejected == []
    names = [r.name for r in resolved]
    assert len(set(names)) == len(names)
    ops = {(r.instance.arch.yaml, r.instance.op.value) for r in resolved}
    assert {("sm80", "fprop"), ("sm80", "dgrad"), ("sm80", "wgrad"), ("sm90a", "fprop"), ("sm90a", "dgrad"),
            ("sm90a", "wgrad")} <= ops


def test_defaults_and_derived_fields():
    r = one(SM80)
    assert r.op is ConvOp.fprop and r.layout is Layout.nhwc and r.dims == 2
    assert r.accumulator is DType.f32 and r.c is DType.f16
    assert r.instruction == Shape3(16, 8, 16) and r.stages == 3 and r.iterator is IteratorAlgorithm.optimized
    assert (r.alignment_a, r.alignment_b, r.alignment_c) == (8, 8, 8)
    r3 = one(SM90)
    assert r3.cluster == Shape3(1, 1, 1) and r3.warp is None and r3.stages >= 2
    assert r3.stride_support is StrideSupport.strided
    d = one(SM80.replace("fprop", "dgrad"))
    assert d.stride_support is StrideSupport.unity    # 2.x dgrad: the unity-stride kernel by default
    name = instance_name(r)
    assert name.startswith("conv2d_fprop_sm80_f16_f16_accf32_nhwc_128x128x64") and name.isidentifier()


def test_sweep_and_exclude():
    insts = expand_text(SM90.replace("op: fprop", "op: [fprop, dgrad, wgrad]").replace("dtype: f16", "dtype: [f16, bf16]")
                        + "dims: [2, 3]\nexclude:\n  - {op: wgrad, dims: 3}\n  - {dtype: bf16, op: dgrad}\n")
    # 3 ops x 2 dtypes x 2 dims = 12, minus wgrad 3d (2 dtypes) and bf16 dgrad (2 dims) = 8
    assert len(insts) == 8
    assert not any(i.op is ConvOp.wgrad and i.dims == 3 for i in insts)


def test_cutlass_generator_defaults_are_expressible():
    """Configurations CUTLASS's generator emits by default (GenerateSM90_Conv3x, sm80 conv2d) resolve."""
    specs = [
        SM90 + "cluster: 2x1x1\n",                                                      # f16 fprop 128x128x64, 2x1x1
        SM90.replace("op: fprop", "op: dgrad") + "cluster: 1x2x1\n",
        SM90.replace("op: fprop", "op: wgrad"),
        SM90.replace("tile: 128x128x64", "tile: 64x64x32"),                              # f16f16_f16f16 64x64x(4*8)
        SM90.replace("dtype: f16", "dtype: bf16").replace("tile: 128x128x64", "tile: 128x256x64") + "cluster: 2x1x1\n",
        SM90.replace("dtype: f16", "dtype: {a: f16, c: f32}"),
        SM90.replace("dtype: f16", "dtype: f32").replace("tile: 128x128x64", "tile: 128x192x32") + "cluster: 2x1x1\n",
        SM90 + "dims: 3\n",
        SM80.replace("dtype: f16", "dtype: bf16"),
        SM80.replace("tile: 128x128x64\nwarp: 64x64x64", "tile: 128x128x32\nwarp: 64x64x32") + "stages: 4\n",
        SM80.replace("dtype: f16", "dtype: tf32").replace("tile: 128x128x64\nwarp: 64x64x64", "tile: 128x128x16\nwarp: 64x64x16"),
        SM80.replace("dtype: f16", "dtype: {a: s8, c: s8}").replace("tile: 128x128x64\nwarp: 64x64x64",
                                                                      "tile: 128x128x64\nwarp: 64x64x64"),
        SM80 + "iterator: analytic\n",
        SM80 + "iterator: fixed_channels\nalignment: {a: 4, b: 4, c: 8}\n",
        SM80 + "iterator: few_channels\nalignment: {a: 2, b: 2, c: 8}\n",
        SM80.replace("op: fprop", "op: wgrad") + "split_k: serial\n",
        SM80 + "dims: 3\n",
        SM80 + "epilogue: relu\n",
        SM90 + "epilogue: {activation: relu, bias: true}\n",
        SM90.replace("dtype: f16", "dtype: {a: s8, c: s32}").replace("tile: 128x128x64", "tile: 128x256x128") + "cluster: 2x1x1\n",
    ]
    for text in specs:
        r = one(text)
        assert not isinstance(r, Rejection), (text, r)


REJECT = [
    (SM90 + "alignment: 1\n", "alignment-tma", "few_channels"),
    (SM90 + "split_k: serial\n", "split-k-3x", "sm80"),
    (SM90 + "iterator: few_channels\n", "iterator-is-2x", "sm80"),
    (SM90 + "warp: 64x64x64\n", "warp-is-2x", "remove"),
    (SM90.replace("op: fprop", "op: dgrad") + "stride_support: strided\nepilogue: {activation: relu}\n",
     "dgrad-strided-activation", "remove the activation"),
    (SM90.replace("tile: 128x128x64", "tile: 96x128x64"), "tile-m", "64, 128 or 256"),
    (SM90.replace("tile: 128x128x64", "tile: 128x128x48"), "tile-k", "k=64"),
    (SM90 + "cluster: 4x2x1\n", "cluster", "m*n <= 4"),
    (SM90 + "stages: 12\n", "smem", "stages <="),
    (SM90.replace("op: fprop", "op: dgrad") + "epilogue: {bias: true}\n", "bias-fprop-only", "remove bias"),
    (SM90.replace("dtype: f16", "dtype: {a: f16, c: bf16}"), "dtype-output", "f16, f32"),
    (SM80.replace("op: fprop", "op: dgrad") + "stride_support: strided\nswizzle: 2\n", "dgrad-strided-swizzle",
     "1, 4 or 8"),
    (SM80.replace("op: fprop", "op: dgrad") + "stride_support: strided\nsplit_k: serial\n", "dgrad-strided-split-k",
     "remove split_k"),
    (SM80.replace("op: fprop", "op: dgrad") + "stride_support: strided\ndims: 3\n", "dgrad-strided-3d",
     "iterator: analytic"),
    (SM80.replace("op: fprop", "op: dgrad") + "dims: 3\niterator: analytic\n", "dgrad-unity-3d", "optimized"),
    (SM80 + "split_k: parallel\n", "split-k-parallel", "serial"),
    (SM80.replace("op: fprop", "op: dgrad") + "iterator: fixed_channels\nalignment: {a: 4, b: 4, c: 8}\n",
     "iterator-channels", "2D fprop"),
    (SM80 + "iterator: few_channels\nalignment: {a: 1, b: 1, c: 8}\n", "alignment-cp-async", "fixed_channels"),
    (SM80 + "epilogue: {bias: true}\n", "bias-2x", "sm90a"),
    (SM80 + "cluster: 2x1x1\n", "cluster-is-3x", "sm90a"),
    (SM80 + "stages: 7\n", "smem", "stages <="),
    (SM80.replace("warp: 64x64x64", "warp: 64x64x32"), "warp-k", "warp k = 64"),
    (SM80.replace("warp: 64x64x64", "warp: 48x64x64"), "warp-divides-tile", "divide"),
    (SM80 + "dims: 3\nalignment: {a: 4, b: 4, c: 8}\n", "alignment-3d", "128-bit"),
    (SM80.replace("arch: sm80", "arch: sm75"), "arch", "sm80"),
    (SM80.replace("dtype: f16", "dtype: e4m3"), "dtype-input", "s8"),
]


@pytest.mark.parametrize("text,rule,fix", REJECT, ids=[r[1] + "-" + str(i) for i, r in enumerate(REJECT)])
def test_rejections_name_the_rule_and_a_fix(text, rule, fix):
    r = one(text)
    assert isinstance(r, Rejection), r
    assert r.rule == rule, (r.rule, r.reason)
    assert fix in r.reason


BAD = [
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\nopp: 1\n", 6, "opp", "unknown key 'opp'"),
    ("family: conv\narch: sm90a\nop: forwards\ndtype: f16\ntile: 128x128x64\n", 3, "op", "unknown value 'forwards'"),
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\ndims: 4\n", 6, "dims", "4 is not allowed"),
    ("family: conv\narch: sm90a\ndtype: f16\ntile: 128x128x64\n", 1, "<root>", "missing required key 'op'"),
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\ndims: 2\nlayout: nhwc\n", 7, "layout",
     "either dims or layout"),
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\niterator: fast\n", 6, "iterator",
     "unknown value 'fast'"),
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\nepilogue: {bias: yes}\n", 6,
     "epilogue.bias", "true or false"),
    ("family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\nexclude: [{tilee: 1x1x1}]\n", 6,
     "exclude[0].tilee", "unknown key 'tilee'"),
]


@pytest.mark.parametrize("text,line,key,message", BAD, ids=[b[3][:30] for b in BAD])
def test_bad_conv_spec_message(write_spec, text, line, key, message):
    path = write_spec(text)
    with pytest.raises(SpecError) as info:
        doc = load_file(path)
        for p, entry, kp in spec_entries(doc):
            list(expand_entry(doc, p, entry, kp))
    err = info.value
    rendered = err.render()
    assert message in rendered, rendered
    assert str(path) in rendered
    assert err.line == line
    assert err.key_path == key
    assert err.exit_code == 2


def test_allowed_values_and_did_you_mean():
    with pytest.raises(SpecError) as info:
        expand_text(SM90 + "iteratr: analytic\n")
    assert "did you mean 'iterator'" in info.value.render()
    with pytest.raises(SpecError) as info:
        expand_text(SM90.replace("op: fprop", "op: convolve"))
    assert "fprop, dgrad, wgrad" in info.value.render()


def test_emit_cli_rejection_exit_and_manifest(tmp_path):
    from click.testing import CliRunner

    from emitter.cli import main
    spec = tmp_path / "c.yaml"
    spec.write_text(SM90 + "alignment: [8, 1]\n")
    res = CliRunner().invoke(main, ["emit", str(spec), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    import json
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(m["instances"]) == 1 and m["instances"][0]["family"] == "conv"
    assert m["instances"][0]["config"]["op"] == "fprop" and m["instances"][0]["config"]["dims"] == 2
    assert [r["rule"] for r in m["rejected"]] == ["alignment-tma"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(SM90.replace("op: fprop", "op: backward"))
    res = CliRunner().invoke(main, ["emit", str(bad), "-o", str(tmp_path / "out2")])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_huge_sweep_is_refused_before_expanding():
    tiles = ", ".join(f"{m}x{n}x64" for m in (64, 128, 256) for n in range(16, 257, 16))
    text = SM90 + f"cluster: [1x1x1, 2x1x1, 1x2x1, 2x2x1]\nstages: [2, 3, 4, 5, 6, 7, 8]\n" + \
        "epilogue: [identity, relu, gelu, silu, sigmoid]\ndtype: [f16, bf16, f32]\nop: [fprop, dgrad, wgrad]\n" + \
        f"dims: [2, 3]\nalignment: [auto, 8, 4, 2, 1]\n"
    text = text.replace("tile: 128x128x64", f"tile: [{tiles}]").replace("op: fprop\n", "", 1).replace("dtype: f16\n", "", 1)
    with pytest.raises(SpecError) as info:
        expand_text(text)
    assert "combinations" in info.value.render() and "tile" in info.value.render()
