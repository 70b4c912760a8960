"""Spec loading, sweep expansion, exclusion and the messages bad specs must produce."""

import textwrap

import pytest

from emitter.dtypes import DType
from emitter.emit import spec_entries
from emitter.errors import SpecError
from emitter.families.gemm.model import Activation, Arch, Bias, KernelSchedule, Layout, Shape3
from emitter.families.gemm.spec import expand_entry
from emitter.spec.loader import load_file, parse_text


def expand_text(text: str, file: str = "t.yaml"):
    doc = parse_text(textwrap.dedent(text), file)
    out = []
    for path, entry, key_paths in spec_entries(doc):
        out += [inst for inst, _ in expand_entry(doc, path, entry, key_paths)]
    return out


BASE = """
arch: sm90a
dtype: bf16
tile: 128x128x64
"""


def test_minimal_spec_defaults():
    [inst] = expand_text(BASE)
    assert inst.arch is Arch.sm90a
    assert (inst.a, inst.b, inst.c, inst.d) == (DType.bf16,) * 4
    assert inst.accumulator is DType.f32 and inst.epilogue_compute is DType.f32
    assert (inst.layout_a, inst.layout_b, inst.layout_c) == (Layout.row, Layout.col, Layout.row)
    assert inst.cluster == Shape3(1, 1, 1) and inst.warp is None
    assert inst.stages == 0 and inst.kernel_schedule is KernelSchedule.auto


def test_sm80_derives_warp_and_no_cluster():
    [inst] = expand_text("arch: sm80\ndtype: f16\ntile: 128x256x32\n")
    assert inst.cluster is None and inst.warp == Shape3(64, 64, 32)


def test_int8_accumulates_in_s32_with_f32_compute():
    [inst] = expand_text("arch: sm80\ndtype: int8\ntile: 128x128x64\n")
    assert inst.a is DType.s8 and inst.accumulator is DType.s32 and inst.epilogue_compute is DType.f32


def test_sweep_is_cartesian_product():
    insts = expand_text("""
        arch: sm90a
        dtype: [bf16, f16]
        tile: [[128, 128, 64], 128x256x64, "64x128x64"]
        cluster: [1x1x1, 2x1x1]
        schedule: {kernel: [cooperative, pingpong]}
        epilogue: {activation: [identity, relu]}
    """)
    assert len(insts) == 2 * 3 * 2 * 2 * 2
    assert len(set(insts)) == len(insts)
    assert {i.tile for i in insts} == {Shape3(128, 128, 64), Shape3(128, 256, 64), Shape3(64, 128, 64)}


def test_single_shape_list_is_not_a_sweep():
    assert len(expand_text("arch: sm90a\ndtype: bf16\ntile: [128, 256, 64]\n")) == 1


def test_exclude_drops_matching_combinations():
    insts = expand_text("""
        arch: sm90a
        dtype: bf16
        tile: [128x128x64, 64x128x64]
        schedule: {kernel: [cooperative, pingpong]}
        exclude:
          - {tile: 64x128x64, schedule: {kernel: cooperative}}
          - {tile: 128x128x64, schedule: pingpong}
    """)
    got = {(str(i.tile), i.kernel_schedule.value) for i in insts}
    assert got == {("128x128x64", "cooperative"), ("64x128x64", "pingpong")}


def test_exclude_with_a_list_value_matches_any():
    insts = expand_text("""
        arch: sm90a
        dtype: [bf16, f16, e4m3]
        tile: 128x128x64
        exclude: [{dtype: {a: [f16, e4m3]}}]
    """)
    assert [i.a for i in insts] == [DType.bf16]


def test_defaults_and_kernels():
    insts = expand_text("""
        defaults:
          arch: sm90a
          dtype: {a: e4m3, b: e4m3, d: bf16}
          layout: tn
        kernels:
          - tile: 128x256x128
          - tile: 64x128x128
            layout: {a: row, b: col, c: col}
    """)
    assert len(insts) == 2
    assert insts[0].c is DType.bf16 and insts[0].d is DType.bf16 and insts[0].a is DType.e4m3
    assert insts[1].layout_c is Layout.col


def test_layout_letters_and_epilogue_shorthand():
    [inst] = expand_text(BASE + "layout: ntn\nepilogue: relu\n")
    assert (inst.layout_a, inst.layout_b, inst.layout_c) == (Layout.col, Layout.row, Layout.col)
    assert inst.epilogue.activation is Activation.relu and inst.epilogue.bias is Bias.none


def test_clamp_bounds():
    [inst] = expand_text(BASE + "epilogue: {activation: clamp, clamp: [-1, 1.5]}\n")
    assert (inst.epilogue.clamp_min, inst.epilogue.clamp_max) == (-1.0, 1.5)


def test_aliases():
    [inst] = expand_text("arch: sm_90a\ndtype: bfloat16\ntile: 128x128x64\nschedule: coop\n")
    assert inst.a is DType.bf16 and inst.kernel_schedule is KernelSchedule.cooperative


def test_fp8_fast_accum_schedule_key():
    [plain] = expand_text("arch: sm90a\ndtype: e4m3\ntile: 128x128x128\nschedule: {kernel: pingpong}\n")
    assert plain.fp8_fast_accum is False
    [fast] = expand_text("arch: sm90a\ndtype: e4m3\ntile: 128x128x128\n"
                         "schedule: {kernel: cooperative, fp8_fast_accum: true}\n")
    assert fast.fp8_fast_accum is True and fast.kernel_schedule is KernelSchedule.cooperative
    assert fast.replace(fp8_fast_accum=False) == expand_text(
        "arch: sm90a\ndtype: e4m3\ntile: 128x128x128\nschedule: {kernel: cooperative}\n")[0]
    swept = expand_text("""
        arch: sm90a
        dtype: e4m3
        tile: 128x128x128
        schedule: {kernel: [cooperative, pingpong], fp8_fast_accum: [false, true]}
        exclude: [{schedule: {kernel: pingpong, fp8_fast_accum: false}}]
    """)
    assert {(i.kernel_schedule.value, i.fp8_fast_accum) for i in swept} == {
        ("cooperative", False), ("cooperative", True), ("pingpong", True)}


def test_scheduler_keys_sweep_and_default():
    [plain] = expand_text(BASE)
    assert (plain.swizzle, plain.raster.value, plain.reduction.value) == (1, "heuristic", "deterministic")
    swept = expand_text(BASE + "split_k: serial\nswizzle: [1, 4]\nraster: [m, along_n]\n"
                               "schedule: {kernel: cooperative, reduction: nondet}\n")
    assert {(i.swizzle, i.raster.value) for i in swept} == {(1, "along_m"), (1, "along_n"), (4, "along_m"),
                                                             (4, "along_n")}
    assert {i.reduction.value for i in swept} == {"nondeterministic"}
    fp8 = expand_text("arch: sm90a\ndtype: {a: e4m3, b: e4m3, c: bf16, d: bf16}\ntile: 128x128x128\n"
                      "schedule: {promotion_interval: [auto, 8, 16]}\n")
    assert [i.promotion_interval for i in fp8] == [0, 8, 16]   # AUTO until resolve() makes it CUTLASS's 4


def test_fp8_fast_accum_reaches_the_manifest_and_the_rejections(tmp_path):
    """Emitted with the name token and the config key; bf16 and sm89 rejected with the rule and a fix."""
    import json

    from emitter.emit import emit

    spec = tmp_path / "fa.yaml"
    spec.write_text(textwrap.dedent("""
        - {arch: sm90a, dtype: {a: e4m3, b: e4m3, c: bf16, d: bf16}, tile: 128x128x128,
           schedule: {kernel: pingpong, fp8_fast_accum: true}}
        - {arch: sm90a, dtype: bf16, tile: 128x128x64, schedule: {fp8_fast_accum: true}}
        - {arch: sm89, dtype: {a: e4m3, b: e4m3, c: bf16, d: bf16}, tile: 128x128x64, warp: 64x64x64, stages: 3,
           schedule: {fp8_fast_accum: true}}
    """))
    emit([str(spec)], tmp_path / "out", jobs=1)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    [inst] = m["instances"]
    assert "_pingpong_fastacc_" in inst["name"] and inst["config"]["fp8_fast_accum"] is True
    assert "FP8FastAccum" in (tmp_path / "out" / inst["source"]).read_text()
    rules = sorted((r["arch"], r["rule"]) for r in m["rejected"])
    assert rules == [("sm89", "fp8-fast-accum"), ("sm90a", "fp8-fast-accum")]
    assert all("remove" in r["reason"] for r in m["rejected"])


def test_sourceless_epilogue_reaches_the_manifest_and_the_rejections(tmp_path):
    """`epilogue: {source: false}`: the sm90a kernel has no C operand (void C), named `nosrc`, with `source: false`
    in its config; the kernels with C keep their names and configs; sm80 and the no-smem epilogue refuse it."""
    import json

    from emitter.emit import emit

    spec = tmp_path / "ns.yaml"
    spec.write_text(textwrap.dedent("""
        - {arch: sm90a, dtype: bf16, tile: 128x128x64, cluster: 2x1x1, epilogue: {source: [true, false]}}
        - {arch: sm90a, dtype: bf16, tile: 128x128x64, epilogue: {source: false}, schedule: {epilogue: nosmem}}
        - {arch: sm80, dtype: f16, tile: 128x128x32, stages: 3, epilogue: {source: false}}
    """))
    emit([str(spec)], tmp_path / "out", jobs=1)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    by_src = {i["config"]["epilogue"].get("source", True): i for i in m["instances"]}
    assert sorted(by_src) == [False, True]
    assert by_src[False]["name"] == by_src[True]["name"] + "_nosrc"
    assert "source" not in by_src[True]["config"]["epilogue"]
    assert "using ElementC = void;" in (tmp_path / "out" / by_src[False]["source"]).read_text()
    rules = sorted((r["arch"], r["rule"]) for r in m["rejected"])
    assert rules == [("sm80", "sourceless-3x-only"), ("sm90a", "sourceless-needs-tma")]


def test_list_of_specs_file():
    assert len(expand_text("- {arch: sm90a, dtype: bf16, tile: 128x128x64}\n- {arch: sm80, dtype: f16, tile: 128x128x32}\n")) == 2


# ----------------------------------------------------------------- bad specs: each with its message
BAD = [
    # (yaml, line, key path, text that must be in the message)
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\ntyle: 1\n", 4, "tyle", "unknown key 'tyle'"),
    ("arch: sm70\ndtype: bf16\ntile: 128x128x64\n", 1, "arch", "unknown value 'sm70'"),
    ("arch: sm90a\ndtype: bf17\ntile: 128x128x64\n", 2, "dtype", "unknown data type 'bf17'"),
    ("arch: sm90a\ndtype: {a: bf16, q: f16}\ntile: 128x128x64\n", 2, "dtype.q", "unknown key 'q' in dtype"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128\n", 3, "tile", "a shape M x N x K is expected"),
    ("arch: sm90a\ndtype: bf16\ntile: [128, 128, 0]\n", 3, "tile", "positive"),
    ("arch: sm90a\ndtype: bf16\ntile: [128x128x64, 12x]\n", 3, "tile[1]", "a shape M x N x K is expected"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nstages: 1\n", 4, "stages", "out of range"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nstages: three\n", 4, "stages", "an integer is expected"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nlayout: xy\n", 4, "layout", "two or three BLAS letters"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nlayout: {a: diagonal}\n", 4, "layout.a", "unknown value 'diagonal'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nschedule: {kernel: fastest}\n", 4, "schedule.kernel", "unknown value 'fastest'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nschedule: {tile_scheduler: greedy}\n", 4, "schedule.tile_scheduler", "unknown value 'greedy'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nepilogue: {activation: tanhh}\n", 4, "epilogue.activation", "unknown value 'tanhh'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nepilogue: {bias: diagonal}\n", 4, "epilogue.bias", "unknown value 'diagonal'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nepilogue: {activation: clamp, clamp: [6, 0]}\n", 4, "epilogue.clamp", "must be below max"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nalignment: 3\n", 4, "alignment", "3 is not allowed"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nswizzle: 16\n", 4, "swizzle", "16 is not allowed"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nsplit_k: sometimes\n", 4, "split_k", "unknown value 'sometimes'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nraster: diagonal\n", 4, "raster", "unknown value 'diagonal'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nschedule: {reduction: atomic}\n", 4, "schedule.reduction",
     "unknown value 'atomic'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nbatched: yes please\n", 4, "batched", "true or false"),
    ("arch: sm90a\ndtype: e4m3\ntile: 128x128x128\nschedule: {promotion_interval: 0}\n", 4,
     "schedule.promotion_interval", "0 is out of range"),
    ("arch: sm90a\ndtype: e4m3\ntile: 128x128x128\nschedule:\n  kernel: pingpong\n  fp8_fast_accum: fast\n", 6,
     "schedule.fp8_fast_accum", "true or false"),
    ("arch: sm90a\ndtype: e4m3\ntile: 128x128x128\nschedule: {fp8_fastaccum: true}\n", 4,
     "schedule.fp8_fastaccum", "did you mean 'fp8_fast_accum'"),
    ("arch: sm90a\ndtype: bf16\n", 1, "<root>", "missing required key 'tile'"),
    ("arch: sm90a\ndtype: bf16\ntile: []\n", 3, "tile", "an empty list sweeps nothing"),
    ("family: conv\narch: sm90a\ndtype: bf16\ntile: 128x128x64\n", 1, "family", "unknown kernel family 'conv'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\narch: sm80\n", 4, "arch", "duplicate key 'arch'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nexclude: {tile: 1x1x1}\n", 4, "exclude", "exclude must be a list"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nexclude: [{tiles: 1x1x1}]\n", 4, "exclude[0].tiles", "unknown key 'tiles'"),
    ("arch: sm90a\ndtype: bf16\ntile: 128x128x64\ncluster: [[2,1,1], [1, 1]]\n", 4, "cluster[1]", "a shape M x N x K is expected"),
    ("arch: sm90a\ndtype: bf16\n  tile: 128x128x64\n", 3, None, "invalid YAML"),
    ("- 3\n", 1, "[0]", "a kernel spec must be a mapping"),
    ("", None, None, "the spec file is empty"),
    ("defaults: {arch: sm90a, dtype: bf16}\nkernels:\n  - tile: 128x128x64\n    op_class: wmma\n", 4, "kernels[0].op_class", "unknown value 'wmma'"),
    ("defaults: {arch: sm9, dtype: bf16}\nkernels:\n  - tile: 128x128x64\n", 1, "defaults.arch", "unknown value 'sm9'"),
    ("defaults: {arch: sm90a}\nkernal: []\nkernels: [{tile: 1x1x1}]\n", 2, "kernal", "unknown top-level key 'kernal'"),
]


@pytest.mark.parametrize("text,line,key,message", BAD, ids=[b[3][:40] for b in BAD])
def test_bad_spec_message(write_spec, text, line, key, message):
    path = write_spec(text)
    with pytest.raises(SpecError) as info:
        doc = load_file(path)
        for p, entry, kp in spec_entries(doc):
            list(expand_entry(doc, p, entry, kp))
    err = info.value
    rendered = err.render()
    assert message in rendered
    assert str(path) in rendered
    assert err.line == line
    if key is not None:
        assert err.key_path == key
    assert err.exit_code == 2


def test_error_lists_allowed_values_and_a_fix():
    with pytest.raises(SpecError) as info:
        expand_text("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nschedule: {kernel: coopertive}\n")
    text = info.value.render()
    assert "allowed: auto, cooperative, pingpong" in text
    assert "fix:" in text


def test_did_you_mean_for_misspelt_key():
    with pytest.raises(SpecError) as info:
        expand_text("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nclustr: 2x1x1\n")
    assert "did you mean 'cluster'" in info.value.render()


def test_missing_file():
    with pytest.raises(SpecError) as info:
        load_file("/nonexistent/spec.yaml")
    assert "not found" in info.value.render()
