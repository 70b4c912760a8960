"""Hostile specs, round three (issue 34): the attention and conv spec parsers and the exclude rules.

Every class the issue names ends in a clean exit 2 naming the file, line, key path and value, or (the last
group) in a warning naming them while the emit succeeds; never an internal error (exit 70), a hang or a silent
empty emit. The property tests at the end draw sweeps and exclude lists of random size and content per family
and check them against a brute-force model of the exclude rule."""

from __future__ import annotations

import itertools
import json
import os
import time
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from emitter.emit import emit, expand_specs
from emitter.errors import SpecError
from emitter.spec import notices, points
from emitter.spec.loader import parse_text
from emitter.spec.sweep import sweep_limit
from tests.hostile_helpers import assert_clean, cli, cli_proc

BIG = "9" * 5000
ATT = "family: attention\narch: sm80\ndtype: f16\nhead_dim: 64\n"
CONV = "family: conv\narch: sm80\nop: fprop\ndtype: f16\n"
GEMM = "arch: sm80\ndtype: f16\n"


def _emit(tmp_path, text: str):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    code, output = cli("emit", spec, "-o", tmp_path / "out")
    return spec, code, output


# ------------------------------------------------------------------------ crashes (were exit 70)
@pytest.mark.parametrize("text,key,dim", [
    (ATT + f'tile: "{BIG}x64"\n', "tile", "tile dimension BlockQ of 5,000 digits is out of range"),
    (ATT + f'tile: ["64x{BIG}"]\n', "tile[0]", "tile dimension BlockKV of 5,000 digits"),
    (CONV + f'tile: "{BIG}x128x32"\n', "tile", "shape dimension M of 5,000 digits is out of range"),
    (CONV + f'tile: 128x128x32\nwarp: "64x{BIG}x32"\n', "warp", "shape dimension N of 5,000 digits"),
    (GEMM + f'tile: "128,128,{BIG}"\n', "tile", "shape dimension K of 5,000 digits"),
    (GEMM + f'tile: 128x128x32\ncluster: "1x1x{BIG}"\n', "cluster", "shape dimension K of 5,000 digits"),
])
def test_thousands_of_digits_in_a_tile_or_shape_string(tmp_path, text, key, dim):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:", dim, f"key:     {key}\n", "characters)", "allowed:")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family,key,value,needle", [
    ("attention", "tile", [10 ** 5000, 64], "tile dimension BlockQ of 5,001 digits is out of range"),
    ("attention", "head_dim", 10 ** 5000, "integer of 5,001 digits is out of range"),
    ("attention", "stages", -(10 ** 5000), "integer of 5,001 digits is out of range"),
    ("gemm", "tile", [128, 10 ** 5000, 32], "shape dimension N of 5,001 digits is out of range"),
    ("gemm", "stages", 10 ** 5000, "integer of 5,001 digits is out of range"),
    ("conv", "swizzle", 10 ** 5000, "integer of 5,001 digits is out of range"),
    ("conv", "tile", [128, 128, 10 ** 5000], "shape dimension K of 5,001 digits"),
], ids=lambda v: v if isinstance(v, str) else "big")
def test_huge_python_ints_in_parsed_data_are_clean_errors(family, key, value, needle):
    """Python data (emitter.api takes dicts) has no YAML digit cap: the shared parser counts digits itself."""
    from emitter.spec.loader import Document

    base = {"gemm": {"arch": "sm80", "dtype": "f16", "tile": "128x128x32"},
            "attention": {"family": "attention", "arch": "sm80", "dtype": "f16", "head_dim": 64, "tile": "64x64"},
            "conv": {"family": "conv", "arch": "sm80", "op": "fprop", "dtype": "f16", "tile": "128x128x32"}}[family]
    with pytest.raises(SpecError) as e:
        expand_specs([Document(file="<dict>", data=dict(base, **{key: value}), text="")])
    text = e.value.render()              # rendering must not hit Python's int-to-text limit either
    assert needle in text and f"key:     {key}" in text and "digits" in text


def test_conv_clamp_bounds_differing_below_g_format_get_distinct_names(tmp_path):
    spec, code, output = _emit(tmp_path, "defaults: {family: conv, arch: sm80, op: fprop, dtype: f16, "
                                         "tile: 128x128x32}\nkernels:\n"
                                         "  - epilogue: {activation: clamp, clamp: [0, 6.0000001]}\n"
                                         "  - epilogue: {activation: clamp, clamp: [0, 6.0000002]}\n"
                                         "  - epilogue: {activation: clamp, clamp: [0, 6]}\n")
    assert_clean(code, output, "emitted 3 instances", exit_code=0)
    names = [e["name"] for e in json.loads((tmp_path / "out" / "manifest.json").read_text())["instances"]]
    assert len(set(names)) == 3, names
    assert sum(n.endswith("_clamp0to6") for n in names) == 1          # exact %g bounds keep their old name
    assert any("clamp0to6p0000001" in n for n in names) and any("clamp0to6p0000002" in n for n in names)


@pytest.mark.parametrize("base,family", [(CONV + "tile: 128x128x32\n", "conv"), (GEMM + "tile: 128x128x32\n", "gemm")])
def test_activation_without_bounds_given_bounds_twice_is_one_instance(tmp_path, base, family):
    """relu ignores clamp bounds: two entries that differ only there are the same kernel (merged), not two
    configs under one name (which was an "instance name collision", exit 70)."""
    lines = "".join("  " + ("- " if i == 0 else "  ") + line + "\n" for i, line in enumerate(base.splitlines()))
    text = ("kernels:\n" + lines + "    epilogue: {activation: relu, clamp: [0, 1]}\n"
            + lines + "    epilogue: {activation: relu, clamp: [0, 2]}\n")
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, "emitted 1 instances", "1 duplicates merged", exit_code=0)
    [entry] = json.loads((tmp_path / "out" / "manifest.json").read_text())["instances"]
    assert entry["name"].endswith("_relu") and "clamp_min" not in json.dumps(entry["config"])


def test_clamp_activation_keeps_its_bounds(tmp_path):
    spec, code, output = _emit(tmp_path, "kernels:\n  - {family: conv, arch: sm80, op: fprop, dtype: f16, "
                                         "tile: 128x128x32, epilogue: {activation: clamp, clamp: [-1, 2]}}\n")
    assert code == 0, output
    [entry] = json.loads((tmp_path / "out" / "manifest.json").read_text())["instances"]
    assert entry["name"].endswith("_clampm1to2")


# ------------------------------------------------------------------------ a hang (attention's exclude)
def test_attention_exclude_has_the_shared_work_cap(tmp_path):
    """A long exclude list against a large attention sweep: refused before matching, like gemm's and conv's."""
    sweep = {"dtype": ["f16", "bf16"], "head_dim": [32, 64, 96, 128, 256], "stages": list(range(1, 9)),
             "mask": ["none", "causal_top_left", "causal_bottom_right"], "lse": [False, True],
             "gqa": [False, True], "varlen": [False, True], "persistent": [False, True], "key_tail": [False, True],
             "layout": ["bshd", "bhsd"], "tile": ["64x64", "128x64", "64x128", "128x128"]}
    excl = [{"stages": s, "head_dim": d, "tile": t} for s in range(1, 9) for d in (32, 64, 96, 128, 256)
            for t in ("64x64", "128x64", "64x128", "128x128")] * 3
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"family": "attention", "arch": "sm80", **sweep, "exclude": excl}))
    t0 = time.perf_counter()
    proc = cli_proc("emit", spec, "-o", tmp_path / "out", timeout=60)
    assert time.perf_counter() - t0 < 20
    assert_clean(proc.returncode, proc.stderr, "480 exclude entries against 61,440 combinations is too much matching",
                 "key:     exclude", "fix:")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ silent loss (exit 0, nothing)
@pytest.mark.parametrize("text,key,needle", [
    (ATT + "tile: 64x64\nexclude: [{name: foo}]\n", "exclude[0]", "holds only `name` (a label"),
    (GEMM + "tile: 128x128x32\nexclude: [{family: gemm, description: x}]\n", "exclude[0]",
     "holds only `family`, `description` (labels"),
    (CONV + "tile: 128x128x32\nexclude:\n  - {op: wgrad}\n  - {name: n}\n", "exclude[1]", "holds only `name`"),
    (GEMM + "tile: 128x128x32\nexclude: [{schedule: {}}]\n", "exclude[0]", "names no value to match"),
    (CONV + "tile: 128x128x32\nexclude: [{epilogue: {}}]\n", "exclude[0]", "names no value to match"),
    (ATT + "tile: 64x64\nexclude: [{exclude: [{dtype: f16}]}]\n", "exclude[0].exclude",
     "cannot hold an `exclude:` of its own"),
])
def test_exclude_entries_that_would_match_everything_are_errors(tmp_path, text, key, needle):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:", needle, f"key:     {key}\n", "value:", "fix:")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,key,needle", [
    (ATT + "tile: [64x64, 128x64]\nexclude: [{dtype: f16}]\n", "exclude[0]",
     "this exclude entry drops every one of the 2 combinations this spec sweeps: nothing would be emitted"),
    (GEMM + "tile: 128x128x32\nexclude: [{dtype: f16}]\n", "exclude[0]",
     "this exclude entry drops the one combination this spec gives: nothing would be emitted"),
    ((CONV + "tile: 128x128x32\nop: [fprop, dgrad]\nexclude: [{op: fprop}, {op: dgrad}]\n").replace("op: fprop\n", "", 1),
     "exclude", "the exclude list drops every one of the 2 combinations this spec sweeps (entries exclude[0], "
                "exclude[1] between them): nothing would be emitted"),
])
def test_an_exclude_that_empties_the_spec_is_an_error(tmp_path, text, key, needle):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:", needle, f"key:     {key}\n", "fix:")
    assert not (tmp_path / "out").exists()


def test_an_emptying_exclude_in_defaults_names_the_defaults_line(tmp_path):
    spec, code, output = _emit(tmp_path, "defaults:\n  family: attention\n  arch: sm80\n  head_dim: 64\n"
                                         "  tile: 64x64\n  exclude: [{dtype: bf16}]\nkernels:\n  - dtype: f16\n"
                                         "  - dtype: bf16\n")
    assert_clean(code, output, f"{spec}:6: error: this exclude entry drops the one combination",
                 "key:     defaults.exclude[0]")


# ------------------------------------------------------------------------ messages that pointed elsewhere
@pytest.mark.parametrize("text,line,key,fix", [
    ("family: attention\narch: sm80\ndtype: f16\nhead_dims: 64\ntile: 64x64\n", 4, "head_dims", "'head_dim'"),
    ("arch: sm80\ndtype: f16\ntlie: 128x128x32\n", 3, "tlie", "'tile'"),
    ("family: conv\narch: sm80\nopp: fprop\ndtype: f16\ntile: 128x128x32\n", 3, "opp", "'op'"),
    ("defaults: {family: attention, arch: sm80, dtype: f16}\nkernels:\n  - head_dim: 64\n    tiles: 64x64\n", 4,
     "kernels[0].tiles", "'tile'"),
])
def test_misspelled_required_key_gets_did_you_mean(tmp_path, text, line, key, fix):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:{line}: error: unknown key", "(the required key", f"key:     {key}\n",
                 f"fix:     did you mean {fix}?")


def test_a_missing_required_key_without_a_near_miss_is_still_missing(tmp_path):
    spec, code, output = _emit(tmp_path, "family: attention\narch: sm80\ndtype: f16\ntile: 64x64\nmask: none\n")
    assert_clean(code, output, "missing required key 'head_dim' in an attention spec", "fix:     add `head_dim:`")


def test_misspelt_required_sub_key_gets_did_you_mean(tmp_path):
    spec, code, output = _emit(tmp_path, "arch: sm80\ndtype: {aa: f16}\ntile: 128x128x32\n")
    assert_clean(code, output, "unknown key 'aa' in dtype", "key:     dtype.aa", "did you mean 'a'?")


@pytest.mark.parametrize("tile,key,value", [
    ("[64, 64.5]", "tile[1]", "64.5"), ("[64.0, 64]", "tile[0]", "64.0"), ("[[64, 64], [128, 64.5]]", "tile[1][1]", "64.5"),
    ("[64.0, 64.5]", "tile[0]", "64.0"), ('[64, "64"]', "tile[1]", "'64'"),
])
def test_float_element_of_an_attention_tile_is_blamed(tmp_path, tile, key, value):
    spec, code, output = _emit(tmp_path, ATT + f"tile: {tile}\n")
    assert_clean(code, output, f"{spec}:5: error: tile dimension", "must be a whole number", f"key:     {key}\n",
                 f"value:   {value}\n")


@pytest.mark.parametrize("text,value", [(ATT + "tile: [64, 64, 64]\n", "[64, 64, 64]"),
                                        (GEMM + "tile: [128, 128]\n", "[128, 128]")])
def test_a_shape_of_the_wrong_length_is_blamed_as_a_whole(tmp_path, text, value):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, " is expected", "key:     tile\n", f"value:   {value}\n", "fix:     give all")


@pytest.mark.parametrize("text,line,key,needle", [
    # the loader gives a key the line where its value starts (the block list under it)
    ("defaults: {arch: sm80, dtype: f16}\nkernel:\n  - tile: 128x128x32\n", 3, "kernel",
     "unknown top-level key 'kernel' beside `defaults:`"),
    ("defaults: {arch: sm80, dtype: f16}\nkernals: [{tile: 128x128x32}]\n", 2, "kernals", "unknown top-level key"),
    ("kernel:\n  - {arch: sm80, dtype: f16, tile: 128x128x32}\n", 2, "kernel", "unknown top-level key 'kernel'"),
])
def test_top_level_kernel_is_did_you_mean_kernels(tmp_path, text, line, key, needle):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:{line}: error: {needle}", f"key:     {key}\n", "did you mean 'kernels'?")
    assert "missing required key" not in output


def test_defaults_without_kernels_is_named(tmp_path):
    spec, code, output = _emit(tmp_path, "defaults: {arch: sm80, dtype: f16}\ntile: 128x128x32\n")
    assert_clean(code, output, f"{spec}:1: error: `defaults:` is given but there is no `kernels:` list",
                 "key:     defaults")


def test_conv_kernel_key_in_a_single_spec_still_works(tmp_path):
    """A conv spec has a `kernel:` key of its own (implicit | gemm_1x1): not taken for a misspelt `kernels:`."""
    spec, code, output = _emit(tmp_path, "family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\n"
                                         "kernel: [implicit, gemm_1x1]\n")
    assert code == 0, output


# ------------------------------------------------------------------------ warnings (the emit succeeds)
@pytest.mark.parametrize("text,line,key,value,needle", [
    (ATT + "tile: 64x64\nmask: [none, causal_top_left]\nexclude: [{mask: none, stages: 3}]\n", 7,
     "exclude[0].stages", "3", "it names `stages`, which the spec never sets"),
    (CONV + "tile: 128x128x32\nsplit_k: [none, serial]\nexclude: [{split_k: serial, epilogue: relu}]\n", 7,
     "exclude[0].epilogue", "'relu'", "it names `epilogue` (which sets activation), which the spec never sets"),
    ("family: conv\narch: sm80\nop: fprop\ndtype: {a: [f16, bf16]}\ntile: 128x128x32\nexclude: [{dtype: f16}]\n", 6,
     "exclude[0].dtype", "'f16'", "`dtype` here stands for a, c, but the spec sets only a (not c)"),
    ("arch: sm80\ndtype: {a: [f16, bf16]}\ntile: 128x128x32\nexclude: [{dtype: bf16}]\n", 4,
     "exclude[0].dtype", "'bf16'", "`dtype` here stands for a, b, c, d, but the spec sets only a (not b, c, d)"),
    (CONV + "tile: 128x128x32\noperation: dgrad\n", 6, "operation", "'dgrad'",
     "both `op` and its alias `operation` are given with different values: `operation: dgrad` is used, "
     "`op: fprop` (line 3) is ignored"),
])
def test_silently_accepted_inputs_warn_and_the_emit_succeeds(tmp_path, text, line, key, value, needle):
    spec, code, output = _emit(tmp_path, text)
    assert_clean(code, output, f"{spec}:{line}: warning: ", needle, f"key:     {key}\n", f"value:   {value}\n",
                 "fix:", "emitted ", exit_code=0)
    assert output.count("warning:") == 1, output
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_warnings_go_to_stderr_and_onto_the_result(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(ATT + "tile: 64x64\nmask: [none, causal_top_left]\nexclude: [{mask: none, stages: 3}]\n")
    proc = cli_proc("emit", spec, "-o", tmp_path / "out", "-q")
    assert proc.returncode == 0 and "warning:" in proc.stderr and "warning:" not in proc.stdout, proc
    res = emit([spec], tmp_path / "out2")
    [w] = res.warnings
    assert (w.file, w.line, w.key_path, w.value) == (str(spec), 7, "exclude[0].stages", 3)


def test_a_shared_defaults_exclude_warns_once(tmp_path):
    spec, code, output = _emit(tmp_path, "defaults:\n  family: attention\n  arch: sm80\n  head_dim: 64\n"
                                         "  tile: 64x64\n  exclude: [{stages: 3, dtype: bf16}]\nkernels:\n"
                                         "  - dtype: [f16, bf16]\n  - dtype: [f16, bf16]\n    mask: causal\n")
    assert code == 0 and output.count("warning:") == 1, output
    assert "key:     defaults.exclude[0].stages" in output


@pytest.mark.parametrize("text", [
    CONV + "tile: 128x128x32\noperation: fprop\n",                           # the same operation twice
    CONV.replace("op: fprop", "op: forward") + "tile: 128x128x32\noperation: fprop\n",   # an alias of the same
    "defaults: {family: conv, arch: sm80, op: fprop, dtype: f16, tile: 128x128x32}\nkernels:\n"
    "  - operation: dgrad\n  - {}\n",                                            # a kernel overrides defaults
    ATT + "tile: 64x64\nstages: [2, 3]\nexclude: [{stages: 3}]\n",             # an exclude of keys the spec sets
    "arch: sm80\ndtype: {a: [f16, bf16]}\ntile: 128x128x32\nexclude: [{dtype: {a: bf16}}]\n",
])
def test_no_warning_where_nothing_is_wrong(tmp_path, text):
    spec, code, output = _emit(tmp_path, text)
    assert code == 0 and "warning:" not in output, output


def test_a_kernel_entry_operation_overrides_a_defaults_op():
    doc = parse_text("defaults: {family: conv, arch: sm80, operation: fprop, dtype: f16, tile: 128x128x32}\n"
                     "kernels:\n  - op: dgrad\n  - {}\n", "d.yaml")
    with notices.collecting() as found:
        cands, _ = expand_specs([doc])
    assert [c.op.value for c in cands] == ["dgrad", "fprop"] and found == []


# ------------------------------------------------------------------------ property: sweeps x exclude lists
# property-test budget per family and mode (12 of them); EMITTER_HYPOTHESIS_EXAMPLES=2000 for a longer hunt
EXAMPLES = max(5, int(os.environ.get("EMITTER_HYPOTHESIS_EXAMPLES", "200")) // 10)
LIMIT = 500              # the sweep cap in force (sweep_limit): small, so that the cap is reached often
WORK = 2_000             # points.EXCLUDE_WORK in force, for the same reason
SECONDS = 10.0           # per example: the original attention hang ran for minutes

# per family: the base spec (its required keys) and, per leaf key, values in the spelling the parser keeps, so
# that equal YAML values are equal parsed values and the brute-force model below can compare the raw ones
FAMILIES = {
    "gemm": ({"arch": "sm80", "dtype": "f16", "tile": "128x128x32"}, {
        "dtype": ["f16", "bf16", "f32", "tf32", "f64", "s8"],
        "tile": ["128x128x32", "64x64x32", "128x64x32", "256x128x32", "64x128x64"],
        "stages": [2, 3, 4, 5, 6, 7, 8], "swizzle": [1, 2, 4, 8], "split_k": ["none", "serial", "parallel"],
        "batched": [False, True], "swap_ab": [False, True], "op_class": ["tensorop", "simt"],
        "raster": ["heuristic", "along_m", "along_n"]}),
    "attention": ({"family": "attention", "arch": "sm80", "dtype": "f16", "head_dim": 64, "tile": "64x64"}, {
        "dtype": ["f16", "bf16", "e4m3"], "head_dim": [32, 64, 96, 128, 256],
        "tile": ["64x64", "128x64", "64x128", "128x128", "32x32"], "stages": [1, 2, 3, 4, 5, 6, 7, 8],
        "mask": ["none", "causal_top_left", "causal_bottom_right"], "lse": [False, True], "gqa": [False, True],
        "varlen": [False, True], "key_tail": [False, True], "layout": ["bshd", "bhsd"],
        "schedule": ["auto", "multistage", "tma", "cooperative", "pingpong"]}),
    "conv": ({"family": "conv", "arch": "sm80", "op": "fprop", "dtype": "f16", "tile": "128x128x32"}, {
        "op": ["fprop", "dgrad", "wgrad"], "dtype": ["f16", "bf16", "f32", "tf32"],
        "tile": ["128x128x32", "64x64x32", "128x64x32"], "stages": [2, 3, 4, 5, 6], "swizzle": [1, 2, 4, 8],
        "split_k": ["none", "serial", "parallel"], "iterator": ["analytic", "optimized"],
        "stride_support": ["unity", "strided"], "kernel": ["implicit", "gemm_1x1"], "swap_ab": [False, True]}),
}


def _some(draw, values: list, least: int, most: int) -> list:
    # a size drawn first: hypothesis keeps drawn lists short, and the caps need long ones now and then
    return draw(st.permutations(values))[:draw(st.integers(min(least, len(values)), min(most, len(values))))]


MODES = {   # what each mode's specs must reach among them (so that no branch of the model goes untested)
    "plain": {"ok", "ok, with warnings", "nothing would be emitted"},   # small sweeps, a few exclude entries
    "big": {"sweeps"},                                                   # a sweep past the cap
    "long": {"too much matching"},                                       # long exclude lists
    "labels": {"holds only"},                                            # an entry of labels only, anywhere
}


@st.composite
def _spec_and_excludes(draw, family: str, mode: str):
    """A spec of the family with some keys swept and an exclude list, sized by `mode` (MODES)."""
    base, keys = FAMILIES[family]
    names = sorted(keys)
    spec = dict(base)
    if mode == "big":      # the six keys with the most values, nearly all of them: past the cap
        swept = sorted(names, key=lambda k: -len(keys[k]))[:6]
        for k in swept:
            spec[k] = _some(draw, keys[k], len(keys[k]) - 1, len(keys[k]))
    else:
        swept = _some(draw, names, *(3, 4) if mode == "long" else (0, 4))
        for k in swept:
            spec[k] = _some(draw, keys[k], *(3, 8) if mode == "long" else (1, 3))
    excl: list[dict] = []
    for _ in range(draw(st.integers(*{"long": (60, 120)}.get(mode, (0, 6))))):
        entry = {}
        for k in _some(draw, swept if swept and draw(st.integers(0, 4)) else names, 1, 3):
            entry[k] = _some(draw, keys[k], 1, 3) if draw(st.integers(0, 3)) == 3 else draw(st.sampled_from(keys[k]))
        excl.append(entry)
    if mode == "labels":
        excl.insert(draw(st.integers(0, len(excl))),
                    draw(st.sampled_from([{"name": "x"}, {"description": "d", "family": family}])))
    if excl:
        spec["exclude"] = excl
    return spec


def _as_list(v):
    return v if isinstance(v, list) else [v]


def _model(family: str, spec: dict) -> tuple[str, object]:
    """What the parser must answer, worked out by brute force in the order the parser checks:
    ("error", message piece) or ("ok", (number of candidates, exclude key paths to warn about))."""
    meta = {"family", "name", "description", "exclude"}
    axes = {k: _as_list(v) for k, v in spec.items() if k not in meta}
    product = 1
    for v in axes.values():
        product *= len(v)
    if product > LIMIT:
        return "error", "sweeps"
    points_, running = [], 0
    for i, entry in enumerate(spec.get("exclude", [])):
        if not set(entry) - meta:
            return "error", "holds only"
        n = 1
        for v in entry.values():
            n *= len(_as_list(v))
        running += n
        if running > LIMIT:
            return "error", "the exclude list sweeps"
        points_ += [dict(zip(entry, combo)) for combo in itertools.product(*map(_as_list, entry.values()))]
    if product * len(points_) > WORK:
        return "error", "too much matching"
    keys = list(axes)
    kept = sum(1 for combo in itertools.product(*axes.values())
               if not any(all(k in axes and dict(zip(keys, combo))[k] == v for k, v in p.items()) for p in points_))
    if kept == 0:
        return "error", "nothing would be emitted"
    unset = {f"exclude[{i}].{k}" for i, e in enumerate(spec.get("exclude", [])) for k in e if k not in axes}
    return "ok", (kept, unset)


def _check(family: str, spec: dict) -> str:
    doc = parse_text(yaml.safe_dump(spec, sort_keys=False), f"prop-{family}.yaml")
    expect, detail = _model(family, spec)
    t0 = time.perf_counter()
    with sweep_limit(LIMIT), mock.patch.object(points, "EXCLUDE_WORK", WORK), notices.collecting() as warned:
        try:
            cands, _ = expand_specs([doc])
        except SpecError as e:
            got = ("error", e.render())
        else:
            got = ("ok", (len(cands), {w.key_path for w in warned}))
    assert time.perf_counter() - t0 < SECONDS
    if expect == "error":
        assert got[0] == "error" and detail in got[1] and f"prop-{family}.yaml" in got[1], (detail, got)
        assert "key:" in got[1]
        return str(detail)
    assert got == ("ok", detail), (spec, got, detail)   # never zero candidates: that case is an error above
    return "ok, with warnings" if detail[1] else "ok"


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_sweeps_and_exclude_lists_match_the_model(family, mode):
    seen: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(spec=_spec_and_excludes(family, mode))
    def check(spec):
        seen.add(_check(family, spec))

    check()
    if EXAMPLES >= 20:
        assert seen >= MODES[mode], seen


def test_python_data_with_a_huge_int_through_the_api_is_a_clean_error():
    """emitter.api takes Python data too: an int too long for repr() reaches the shape parser's range check
    (SpecError naming the key) instead of a ValueError from printing it."""
    from emitter import api
    from emitter.errors import SpecError

    with pytest.raises(SpecError) as e:
        api.resolve_specs({"family": "gemm", "arch": "sm80", "dtype": "f16", "layout": "tn",
                           "tile": [10 ** 5000, 128, 32]})
    assert "5,001 digits" in str(e.value) and "tile" in str(e.value)
