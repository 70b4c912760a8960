"""Hostile specs (issue 25): every bad input ends in a clear error (file, line, key path, value, allowed,
fix), exit code 2, within seconds and without creating the output directory; valid oddities work."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from emitter.errors import SpecError
from emitter.emit import emit
from emitter.spec.loader import MAX_DEPTH, parse_text
from tests.hostile_helpers import assert_clean, cli, cli_proc

# property-test budget: 200 examples in CI; EMITTER_HYPOTHESIS_EXAMPLES=5000 for a longer hunt
EXAMPLES = int(os.environ.get("EMITTER_HYPOTHESIS_EXAMPLES", "200"))
BASE = "arch: sm80\ndtype: f16\ntile: 128x128x32\n"


def _laughs() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 12):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


_TWELVE = "".join(f"{k}: [{', '.join(v)}]\n" for k, v in {
    "arch": ["sm80"] * 1, "tile": [f"{m}x128x32" for m in range(16, 336, 16)],
    "stages": [str(s) for s in range(2, 16)] + ["auto"] * 0, "swizzle": ["1", "2", "4", "8"],
    "split_k": ["none", "serial", "parallel"], "batched": ["true", "false"], "swap_ab": ["true", "false"],
    "op_class": ["tensorop", "simt"], "raster": ["heuristic", "along_m", "along_n"],
}.items()) + "dtype: {a: [f16, bf16, f32, tf32], b: [f16, bf16, f32, tf32], c: [f16, bf16, f32], d: [f16, bf16, f32]}\n"

# (id, spec bytes, expected line or None, pieces the message must hold)
CASES = [
    ("billion-laughs", _laughs().encode(), 1, ["expands to more than", "aliases", "fix:"]),
    ("recursive-anchor", b"arch: &a [sm80, *a]\ndtype: f16\ntile: 128x128x32\n", 1,
     ["recursive anchor", "key:     arch[1]"]),
    ("500-nested-lists", (BASE + "warp: " + "[" * 500 + "]" * 500 + "\n").encode(), 4,
     [f"nested more than {MAX_DEPTH} levels", "allowed: at most 64 levels"]),
    ("200k-nested-flow", ("x: " + "[" * 200000 + "]" * 200000 + "\n").encode(), 1, ["nesting depth"]),
    ("control-char", (BASE + 'description: "a\x01b"\n').encode(), 4, ["control characters", "#x0001"]),
    ("nul-byte", (BASE + "description: a\x00b\n").encode(), 4, ["#x0000"]),
    ("latin-1", b"arch: sm80\n# caf\xe9\ndtype: f16\ntile: 128x128x32\n", 2, ["not UTF-8", "0xe9", "Latin-1"]),
    ("unterminated-double-quote", b'arch: sm80\ndtype: "f16\ntile: 128x128x32\nstages: 3\n', 2,
     ["never closed", "quoted scalar"]),
    ("unterminated-single-quote", b"arch: sm80\ndtype: f16\ntile: '128x128x32\nstages: 3\n\n", 3, ["never closed"]),
    ("unclosed-bracket", b"arch: sm80\ndtype: f16\ntile: [128, 128, 32\nstages: 3\n", 4, ["flow sequence opened at line 3"]),
    ("octal-010", (BASE + "stages: 010\n").encode(), 4, ["leading zero", "octal", "key:     stages", "write 10"]),
    ("base-60", (BASE + "stages: 1:30\n").encode(), 4, ["base-60", "key:     stages"]),
    ("yes-is-not-bool", (BASE + "batched: yes\n").encode(), 4, ["true or false", "key:     batched", "'yes'"]),
    ("5000-digit-stages", (BASE + "stages: " + "9" * 5000 + "\n").encode(), 4,
     ["5000 digits", "out of range", "key:     stages", "allowed: at most 30 digits"]),
    ("5000-digit-tile-dim", ("arch: sm80\ndtype: f16\ntile: [128, 128, " + "9" * 5000 + "]\n").encode(), 3,
     ["5000 digits", "key:     tile[2]"]),
    ("float-beyond-double", (BASE + "epilogue: {activation: clamp, clamp: [0, 1.0e+400]}\n").encode(), 4,
     ["beyond the range of a double", "epilogue.clamp[1]"]),
    ("float-1e400-no-dot", (BASE + "epilogue: {activation: clamp, clamp: [0, 1e400]}\n").encode(), 4,
     ["beyond the range of a double"]),
    ("clamp-beyond-cpp-float", (BASE + "epilogue: {activation: clamp, clamp: [0, 1e300]}\n").encode(), 4,
     ["C++ float", "epilogue.clamp[1]", "3.402823e+38"]),
    ("clamp-400-digit-int", (BASE + "epilogue: {activation: clamp, clamp: [0, 1" + "0" * 400 + "]}\n").encode(), 4,
     ["401 digits", "epilogue.clamp[1]"]),
    ("clamp-same-float", (BASE + "epilogue: {activation: clamp, clamp: [1.0, 1.00000001]}\n").encode(), 4,
     ["same number as C++ floats", "epilogue.clamp"]),
    ("clamp-nan", (BASE + "epilogue: {activation: clamp, clamp: [0, .nan]}\n").encode(), 4, ["finite number"]),
    ("tile-fraction", b"arch: sm80\ndtype: f16\ntile: [128, 128, 32.5]\n", 3,
     ["whole number", "key:     tile[2]", "value:   32.5"]),
    ("tile-string-element", b"arch: sm80\ndtype: f16\ntile: [128, x, 32]\n", 3, ["key:     tile"]),
    ("sweep-twelve-fields", _TWELVE.encode(), None,
     ["sweeps 11,612,160 combinations", "tile (20) x stages (14)", "dtype (144)", "--max-instances"]),
    ("sweep-nested-mapping", (b"arch: sm80\ntile: 128x128x32\ndtype: {"
                              + b", ".join(k.encode() + b": [" + b", ".join([b"f16", b"bf16", b"f32", b"tf32", b"f64"] * 4)
                                           + b"]" for k in ("a", "b", "c", "d", "accumulator", "epilogue")) + b"}\n"), 3,
     ["dtype sweeps", "dtype.a (20)", "dtype.epilogue (20)", "64,000,000"]),
    ("keys-not-strings", (BASE + "1: x\n").encode(), 4, ["keys must be strings"]),
    ("merge-key", b"d: &d {arch: sm80}\n<<: *d\n", 2, ["merge keys"]),
    ("empty-file", b"", None, ["empty"]),
    ("only-comment", b"# nothing\n", None, ["empty"]),
    ("scalar-document", b"42\n", None, ["a mapping or a list"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_clean_error(tmp_path, case):
    _id, data, line, pieces = case
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(data)
    out = tmp_path / "out"
    t0 = time.perf_counter()
    code, output = cli("emit", spec, "-o", out)
    assert time.perf_counter() - t0 < 10
    where = f"{spec}:{line}: error" if line else f"{spec}"
    assert_clean(code, output, where, "error:", *pieces)
    assert not out.exists(), "a failed emit must not create the output directory"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-symlink", "symlink-loop", "huge-file", "directory", "missing"])
def test_spec_that_is_not_a_regular_file(tmp_path, kind):
    p = tmp_path / "spec.yaml"
    expect = {"fifo": "FIFO", "dev-zero-symlink": "character device", "symlink-loop": "symlink loop",
              "huge-file": "bytes", "directory": "is a directory", "missing": "not found"}[kind]
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero-symlink":
        p.symlink_to("/dev/zero")
    elif kind == "symlink-loop":
        p.symlink_to(tmp_path / "other.yaml")
        (tmp_path / "other.yaml").symlink_to(p)
    elif kind == "huge-file":
        with open(p, "wb") as f:
            f.truncate(5 << 20)          # sparse: no disk, 5 MiB past the 4 MiB cap
    elif kind == "directory":
        p.mkdir()
    # a fresh process with a timeout: a FIFO or /dev/zero must not block or fill memory
    proc = cli_proc("emit", p, "-o", tmp_path / "out", timeout=20)
    assert_clean(proc.returncode, proc.stderr, str(p), expect)
    assert not (tmp_path / "out").exists()


def test_billion_laughs_is_bounded_in_time_and_memory(tmp_path):
    spec = tmp_path / "laughs.yaml"
    spec.write_text(_laughs())
    t0 = time.perf_counter()
    proc = cli_proc("emit", spec, "-o", tmp_path / "out", timeout=20)
    assert time.perf_counter() - t0 < 10
    assert_clean(proc.returncode, proc.stderr, "expands to more than")


def test_max_instances_caps_and_raises(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("arch: sm80\ndtype: [f16, bf16, f32]\ntile: [128x128x32, 64x64x32, 128x64x32]\n")
    code, out = cli("emit", spec, "-o", tmp_path / "o", "--max-instances", "4")
    assert_clean(code, out, "sweeps 9 combinations", "dtype (3) x tile (3)", "at most 4")
    assert not (tmp_path / "o").exists()
    code, out = cli("emit", spec, "-o", tmp_path / "o", "--max-instances", "9")
    assert code == 0, out


def test_sweep_cap_counts_every_entry_together(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("defaults: {arch: sm80, tile: 128x128x32}\nkernels:\n"
                    "  - dtype: [f16, bf16, f32]\n  - dtype: [f16, bf16, f32]\n")
    code, out = cli("emit", spec, "-o", tmp_path / "o", "--max-instances", "5")
    assert_clean(code, out, "together expand to more than 5", "kernels[1]")


def test_exclude_matching_work_is_bounded(tmp_path):
    spec = tmp_path / "s.yaml"
    excl = ", ".join(f"{{tile: {m}x128x32, stages: {st}}}" for m in range(16, 4096, 16) for st in range(2, 12))
    spec.write_text("arch: sm80\ndtype: [f16, bf16, f32, f64]\nstages: [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\n"
                    "swizzle: [1, 2, 4, 8]\ntile: [" + ", ".join(f"{m}x{n}x32" for m in range(16, 1040, 16)
                                                        for n in (64, 128, 256)) + f"]\nexclude: [{excl}]\n")
    t0 = time.perf_counter()
    code, out = cli("emit", spec, "-o", tmp_path / "o")
    assert time.perf_counter() - t0 < 10
    assert_clean(code, out, "exclude entries against", "too much matching", "key:     exclude")


def test_exclude_list_is_capped_too(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("arch: sm80\ndtype: f16\ntile: 128x128x32\n"
                    "exclude: [{stages: [2, 3, 4, 5, 6], swizzle: [1, 2, 4, 8]}]\n")
    code, out = cli("emit", spec, "-o", tmp_path / "o", "--max-instances", "10")
    assert_clean(code, out, "this exclude entry sweeps 20", "stages (5) x")


# ------------------------------------------------------------------- legitimately valid inputs work
def test_split_k_off_means_none_and_exponent_floats_are_numbers(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(BASE + "split_k: off\nepilogue: {activation: clamp, clamp: [-1e5, 1e5]}\n")
    res = emit([spec], tmp_path / "o")
    [r] = res.instances
    assert r.instance.split_k.value == "none"
    assert r.instance.epilogue.clamp_max == 1e5 and "clampm100000to100000" in r.name


def test_clamp_bounds_differing_past_the_sixth_digit_get_distinct_names(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("defaults: {arch: sm80, dtype: f16, tile: 128x128x32}\nkernels:\n"
                    "  - epilogue: {activation: clamp, clamp: [0, 6.0000001]}\n"
                    "  - epilogue: {activation: clamp, clamp: [0, 6.0000002]}\n"
                    "  - epilogue: {activation: clamp, clamp: [0, 6]}\n")
    res = emit([spec], tmp_path / "o")
    names = [r.name for r in res.instances]
    assert len(set(names)) == 3 and any(n.endswith("clamp0to6") for n in names), names
    data = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert len(data["instances"]) == 3


def test_non_utf8_spec_file_name(tmp_path):
    name = os.fsdecode(b"caf\xe9.yaml")
    spec = tmp_path / name
    spec.write_text(BASE)
    code, out = cli("emit", spec, "-o", tmp_path / "o")
    assert code == 0, out
    [cu] = (tmp_path / "o").glob("*.cu")
    head = cu.read_text(encoding="utf-8")[:600]
    assert "xe9.yaml" in head          # the byte is spelled out (a lone surrogate would not encode)


def test_spec_file_name_cannot_inject_cpp(tmp_path):
    spec = tmp_path / "x\n#error injected\n.yaml"
    spec.write_text(BASE)
    code, out = cli("emit", spec, "-o", tmp_path / "o")
    assert code == 0, out
    [cu] = (tmp_path / "o").glob("*.cu")
    assert "\n#error injected" not in cu.read_text()


def test_deep_but_allowed_nesting_still_parses():
    doc = parse_text("a: " + "[" * 30 + "]" * 30 + "\n", "t.yaml")
    assert isinstance(doc.data["a"], list)


# ------------------------------------------------------------------- property: random malformed YAML
_YAML_BITS = st.sampled_from([
    "arch: sm80\n", "dtype: f16\n", "tile: 128x128x32\n", "tile: [128, 128, 32]\n", "stages: 3\n", "stages: 010\n",
    "split_k: off\n", "batched: yes\n", "&a ", "*a", "*b", "[", "]", "{", "}", ": ", ", ", "- ", "\n", "  ", "'", '"',
    "\x00", "\x01", "\t", "#", "!!python/object:os.system ", "!!int ", "<<: ", "1e999", "-.inf", ".nan", "9" * 40,
    "kernels:\n", "defaults:\n", "exclude: [{stages: 3}]\n", "epilogue: {activation: clamp, clamp: [0, 1e300]}\n",
    "\ufeff", "é", "\u2028", "? ", "|\n", ">\n", "---\n", "...\n", "%YAML 1.1\n", "&a [x, *a]",
])


@settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_YAML_BITS, max_size=30), noise=st.text(max_size=40))
def test_random_malformed_yaml_gives_spec_error_or_success(tmp_path_factory, parts, noise):
    text = "".join(parts) + noise
    tmp = tmp_path_factory.mktemp("prop")
    spec = tmp / "s.yaml"
    spec.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        emit([spec], tmp / "out", jobs=1)
    except SpecError as e:
        rendered = e.render()
        assert "error:" in rendered and str(spec) in rendered
        assert not (tmp / "out").exists()


@settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                         lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                         max_leaves=20))
def test_random_spec_structures_give_spec_error_or_candidates(data):
    """Well-formed YAML of any shape: the gemm parser answers with SpecError or candidates, nothing else."""
    from emitter.emit import expand_specs
    from emitter.spec.loader import Document

    entry = {"arch": "sm80", "dtype": "f16", "tile": "128x128x32"}
    if isinstance(data, dict):
        entry.update({k: v for k, v in data.items()})
    doc = Document(file="prop.yaml", data=entry, text=repr(entry))
    try:
        expand_specs([doc])
    except SpecError as e:
        assert "prop.yaml" in e.render()


# Every mapping-valued key of every family, given an empty mapping or a mapping missing its required sub-keys:
# a clean error (exit 2) or a valid spec (exit 0), never an internal error (exit 70). `dtype: {}` once reached
# the instance builder and ended in KeyError 'a'.
_FAMILY_BASE = {
    "gemm": "family: gemm\narch: sm90a\ndtype: bf16\ntile: 128x128x64\n",
    "attention": "family: attention\narch: sm90a\ndtype: f16\nhead_dim: 128\ntile: 128x128\n",
    "conv": "family: conv\narch: sm90a\nop: fprop\ndtype: f16\ntile: 128x128x64\n",
}
_MAPPING_KEYS = ["dtype", "layout", "alignment", "epilogue", "schedule", "cluster", "tile"]


@pytest.mark.parametrize("family", sorted(_FAMILY_BASE))
@pytest.mark.parametrize("key", _MAPPING_KEYS)
@pytest.mark.parametrize("value", ["{}", "{c: f16}", "[{}]"])
def test_empty_or_partial_mappings_never_crash(tmp_path, family, key, value):
    base = "".join(line + "\n" for line in _FAMILY_BASE[family].splitlines() if not line.startswith(f"{key}:"))
    spec = tmp_path / "spec.yaml"
    spec.write_text("kernels:\n" + "".join(("  - " if i == 0 else "    ") + line + "\n"
                                           for i, line in enumerate((base + f"{key}: {value}\n").splitlines())))
    code, output = cli("emit", spec, "-o", tmp_path / "out")
    assert "Traceback" not in output and "internal error" not in output, output
    assert code in (0, 2), (code, output)
    if code == 2:
        assert f"{spec}:" in output and "error:" in output, output


# Property test over every family's own keys: a valid base spec with one known key (or one sub-key of a mapping
# key) replaced by a random value built from plausible tokens. emit answers with a SpecError naming the file, or
# writes a manifest; any other exception is a bug (this class found `dtype: {}` ending in KeyError 'a').
_TOKENS = st.sampled_from([
    "f16", "bf16", "f32", "tf32", "e4m3", "s8", "f64", "tn", "nt", "row", "col", "relu", "gelu", "clamp", "auto",
    "none", "serial", "parallel", "stream_k", "persistent", "cooperative", "pingpong", "tma", "implicit",
    "gemm_1x1", "fprop", "dgrad", "wgrad", "causal_top_left", "causal_bottom_right", "128x128x64", "128x64",
    "1x2x1", "2x1x1", "64x64x64", "sm80", "sm90a", "", "x", "-1", "1e400"])
_SUBKEYS = st.sampled_from(["a", "b", "c", "d", "accumulator", "epilogue", "kernel", "activation", "bias", "clamp",
                            "min", "max", "tile_scheduler", "source", "q", "k", "v", "o", "zz"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1 << 20) | st.floats(allow_nan=True) | _TOKENS,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(_SUBKEYS, c, max_size=3), max_leaves=6)


def _family_keys(family: str) -> list[str]:
    import importlib
    return sorted(importlib.import_module(f"emitter.families.{family}.spec").SPEC_KEYS)


@pytest.mark.parametrize("family", sorted(_FAMILY_BASE))
def test_random_values_for_each_familys_keys_give_spec_error_or_a_manifest(tmp_path_factory, family):
    import yaml

    base = yaml.safe_load(_FAMILY_BASE[family])
    keys = _family_keys(family)

    @settings(max_examples=max(EXAMPLES // 2, 20), deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(key=st.sampled_from(keys), sub=st.none() | _SUBKEYS, value=_VALUES)
    def check(key, sub, value):
        entry = dict(base)
        entry[key] = {sub: value} if sub is not None else value
        tmp = tmp_path_factory.mktemp("fam")
        spec = tmp / "s.yaml"
        spec.write_text(yaml.safe_dump({"kernels": [entry]}, allow_unicode=True))
        try:
            emit([spec], tmp / "out", jobs=1)
        except SpecError as e:
            assert "error:" in e.render() and str(spec) in e.render()
            assert not (tmp / "out").exists()
        else:
            assert (tmp / "out" / "manifest.json").is_file()

    check()
