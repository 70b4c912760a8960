"""Hostile manifests and build records (issue 25): nothing in them is trusted. Wrong types give a clean
ManifestError (exit 2); names must be C identifiers, sources relative paths inside the directory; a
symlink that leads out is refused; `emitter build` never reads, writes or deletes outside the manifest
directory and the cache, whatever the manifest says (checked with a fake nvcc: no real compile)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from emitter.errors import ManifestError
from emitter.fsutil import PathEscape, resolve_inside
from emitter.manifest import load, validate
from tests.hostile_helpers import (assert_clean, cli, entry, install_fake_nvcc, nvcc_calls, snapshot,
                                   write_manifest)

CU = "// a tiny instance\n"


def _m(instances, rejected=None, **top):
    data = {"schema_version": 1, "emitter_version": "0.1.0", "specs": [], "instances": instances,
            "rejected": [] if rejected is None else rejected}
    data.update(top)
    return data


# (id, manifest data, pieces of the message)
BAD = [
    ("instances-ints", _m([1]), ["instances[0] must be an object, not a number"]),
    ("instances-not-list", _m({"a": 1}), ["'instances' must be a list, not an object"]),
    ("name-int", _m([entry(5, source="x.cu")]), ["instances[0].name must be a string, not a number"]),
    ("name-traversal", _m([entry("../../victim/x", source="x.cu")]), ["not a C identifier", "../../victim/x"]),
    ("name-slash", _m([entry("a/b", source="x.cu")]), ["not a C identifier"]),
    ("name-space", _m([entry("a b", source="x.cu")]), ["not a C identifier"]),
    ("name-empty", _m([entry("", source="x.cu")]), ["not a C identifier"]),
    ("name-too-long", _m([entry("k" * 201, source="x.cu")]), ["at most 200"]),
    ("name-leading-digit", _m([entry("1abc", source="x.cu")]), ["not a C identifier"]),
    ("source-absolute", _m([entry("k", source="/etc/passwd")]), ["source '/etc/passwd' is refused", "absolute"]),
    ("source-dotdot", _m([entry("k", source="../../x.cu")]), ["'..'"]),
    ("source-int", _m([entry("k", source=7)]), ["source must be a string"]),
    ("source-nul", _m([entry("k", source="a\u0000.cu")]), ["control characters"]),
    ("source-empty", _m([entry("k", source="")]), ["empty"]),
    ("config-list", _m([entry("k", config=[1])]), ["config must be an object"]),
    ("arch-null", _m([entry("k", arch=None)]), ["arch must be a string, not null"]),
    ("missing-keys", _m([{"name": "k"}]), ["lacks"]),
    ("duplicate-names", _m([entry("k"), entry("k")]), ["duplicate instance name k"]),
    ("rejected-ints", _m([], rejected=[1]), ["rejected[0] must be an object"]),
    ("schema-version", _m([], schema_version=99), ["schema_version 99 is not supported"]),
    ("top-level-list", [1, 2], ["not a manifest"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_manifest_clean_error(tmp_path, case):
    _id, data, pieces = case
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        load(tmp_path)
    for p in pieces:
        assert p in str(info.value), (p, str(info.value))
    code, out = cli("list", tmp_path)
    assert_clean(code, out, *pieces)


@pytest.mark.parametrize("kind", ["not-json", "not-utf8", "deep-json", "fifo", "directory", "dev-zero"])
def test_unreadable_manifest_clean_error(tmp_path, kind):
    p = tmp_path / "manifest.json"
    expect = {"not-json": "not valid JSON", "not-utf8": "not UTF-8", "deep-json": "nested too deeply",
              "fifo": "not a regular file", "directory": "is a directory", "dev-zero": "not a regular file"}[kind]
    if kind == "not-json":
        p.write_text("{ half")
    elif kind == "not-utf8":
        p.write_bytes(b'{"a": "\xe9"}')
    elif kind == "deep-json":
        p.write_text("[" * 100000 + "]" * 100000)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    else:
        p.symlink_to("/dev/zero")
    code, out = cli("list", tmp_path)
    assert_clean(code, out, expect)


# ------------------------------------------------------------------------------- emitter build
@pytest.fixture
def fake(tmp_path, monkeypatch):
    return install_fake_nvcc(tmp_path, monkeypatch)


def _world(tmp_path: Path) -> tuple[Path, Path]:
    """A manifest directory `m` next to a victim directory holding files that must not change."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.cu").write_text("// victim source\n")
    (victim / "x").mkdir()
    (victim / "x" / "record.json").write_text('{"victim": true}')
    (victim / "libx.so").write_text("victim library")
    (victim / "secret").write_text("secret")
    return tmp_path / "m", victim


def _build(m: Path, tmp_path: Path):
    return cli("build", m, "--no-progress", "-j", "1", "--cache-dir", tmp_path / "cache")


def test_good_manifest_builds_with_the_fake_nvcc(tmp_path, fake):
    m, _ = _world(tmp_path)
    write_manifest(m, [entry("k")], sources={"k.cu": CU})
    code, out = _build(m, tmp_path)
    assert code == 0, out
    rec = json.loads((m / "build" / "k" / "record.json").read_text())
    assert rec["status"] == "ok" and set(rec["artifact_sha256"]) == {"cubin", "host"}
    assert len(nvcc_calls(fake)) == 2


@pytest.mark.parametrize("case", [
    ("name-traversal", lambda m, v: ([entry("../../victim/x", source="k.cu")], {"k.cu": CU}), "not a C identifier"),
    ("absolute-source", lambda m, v: ([entry("k", source=str(v / "x.cu"))], {}), "absolute"),
    ("dotdot-source", lambda m, v: ([entry("k", source="../victim/x.cu")], {}), "'..'"),
    ("symlink-source", lambda m, v: ([entry("k")], {}), "leads outside"),
    ("symlink-build-dir", lambda m, v: ([entry("k")], {"k.cu": CU}), "build is a symlink"),
    ("symlink-instance-dir", lambda m, v: ([entry("k")], {"k.cu": CU}), "build/k is a symlink"),
    ("symlink-artifact", lambda m, v: ([entry("k")], {"k.cu": CU}), "build/k/libk.so is a symlink"),
    ("source-is-dir", lambda m, v: ([entry("k", source="sub")], {}), "not a regular file"),
], ids=lambda c: c[0])
def test_malicious_manifest_cannot_touch_outside(tmp_path, fake, case):
    kind, make, message = case
    m, victim = _world(tmp_path)
    instances, sources = make(m, victim)
    write_manifest(m, instances, sources=sources)
    if kind == "symlink-source":
        (m / "k.cu").symlink_to(victim / "x.cu")
    elif kind == "symlink-build-dir":
        (m / "build").symlink_to(victim)
    elif kind == "symlink-instance-dir":
        (m / "build").mkdir()
        (m / "build" / "k").symlink_to(victim / "x")
    elif kind == "symlink-artifact":
        (m / "build" / "k").mkdir(parents=True)
        (m / "build" / "k" / "libk.so").symlink_to(victim / "libx.so")
    elif kind == "source-is-dir":
        (m / "sub").mkdir()
    before = snapshot(victim)
    code, out = _build(m, tmp_path)
    assert_clean(code, out, message)
    assert snapshot(victim) == before, "the build touched a file outside its directory"
    assert nvcc_calls(fake) == [], "nothing may be compiled from a refused manifest"


# ------------------------------------------------------------------------------- build records
def _built(tmp_path, fake) -> Path:
    m, _ = _world(tmp_path)
    write_manifest(m, [entry("k")], sources={"k.cu": CU})
    assert _build(m, tmp_path)[0] == 0
    return m


@pytest.mark.parametrize("edit,message", [
    (lambda rec, v: rec["artifacts"].update(host=str(v / "libx.so")), "absolute"),
    (lambda rec, v: rec["artifacts"].update(cubin="../victim/libx.so"), "'..'"),
    (lambda rec, v: rec["artifacts"].update(host=5), "must be a string"),
    (lambda rec, v: rec.update(artifacts=[1]), "not a build record"),
], ids=["absolute-artifact", "dotdot-artifact", "int-artifact", "artifacts-list"])
def test_build_record_paths_are_contained(tmp_path, fake, edit, message):
    from emitter.runtime.backend import NotBuilt, build_record

    m = _built(tmp_path, fake)
    victim = tmp_path / "victim"
    path = m / "build" / "k" / "record.json"
    rec = json.loads(path.read_text())
    edit(rec, victim)
    path.write_text(json.dumps(rec))
    with pytest.raises(NotBuilt) as info:
        build_record(m, "k")
    assert message in str(info.value)


def test_build_record_symlinked_artifact_leading_out_is_refused(tmp_path, fake):
    from emitter.runtime.backend import NotBuilt, build_record

    m = _built(tmp_path, fake)
    so = m / "build" / "k" / "libk.so"
    so.unlink()
    so.symlink_to(tmp_path / "victim" / "libx.so")
    with pytest.raises(NotBuilt) as info:
        build_record(m, "k")
    assert "leads outside" in str(info.value)


@pytest.mark.parametrize("text", ["[1, 2]", "{ half", "[" * 50000 + "]" * 50000], ids=["list", "not-json", "deep"])
def test_build_record_garbage_is_not_built(tmp_path, fake, text):
    from emitter.runtime.backend import NotBuilt, build_record

    m = _built(tmp_path, fake)
    (m / "build" / "k" / "record.json").write_text(text)
    with pytest.raises(NotBuilt):
        build_record(m, "k")


def test_export_record_reading_is_contained(tmp_path, fake):
    from emitter.library.export import _build_failed

    m = _built(tmp_path, fake)
    rec = m / "build" / "k" / "record.json"
    rec.unlink()
    outside = tmp_path / "victim" / "record.json"
    outside.write_text(json.dumps({"status": "failed", "error": "planted"}))
    rec.symlink_to(outside)
    why = _build_failed(m, "k")
    assert why is not None and "leads outside" in why
    (m / "build" / "k" / "record.json").unlink()
    (m / "build" / "k" / "record.json").write_text("[1]")
    assert _build_failed(m, "k") is None


def test_resolve_inside_helper(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.cu").write_text("x")
    assert resolve_inside(tmp_path / "d", "a.cu") == (tmp_path / "d" / "a.cu").resolve()
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d" / "loop")
    for bad in ("/etc/passwd", "../x", "a/../../x", "", None, 3, "a\nb"):
        with pytest.raises(PathEscape):
            resolve_inside(tmp_path / "d", bad)
    (tmp_path / "d" / "out").symlink_to(tmp_path)
    (tmp_path / "x").write_text("outside")
    with pytest.raises(PathEscape):
        resolve_inside(tmp_path / "d", "out/x")
    assert resolve_inside(tmp_path / "d", "out/d/a.cu") == (tmp_path / "d" / "a.cu").resolve()   # back inside
    resolve_inside(tmp_path / "d", "loop")     # a symlink loop inside: no exception but PathEscape is allowed


def test_validate_accepts_what_emit_writes(tmp_path):
    from emitter.emit import emit
    from tests.hostile_helpers import ROOT

    res = emit([ROOT / "configs" / "gemm" / "sm80.yaml"], tmp_path / "o")
    validate(json.loads((tmp_path / "o" / "manifest.json").read_text()))
    assert res.instances


# ------------------------------------------------------------------------------- property
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=5),
                     max_leaves=25)
_FIELD = st.sampled_from(["name", "family", "arch", "source", "spec", "spec_hash", "config"])


@settings(max_examples=int(os.environ.get("EMITTER_HYPOTHESIS_EXAMPLES", "200")), deadline=2000,
          suppress_health_check=[HealthCheck.too_slow])
@given(base=st.lists(st.fixed_dictionaries({}, optional={k: _JSON for k in
                                                         ("name", "family", "arch", "source", "spec", "spec_hash",
                                                          "config")}), max_size=3),
       junk=_JSON, field=_FIELD)
def test_random_manifests_give_manifest_error_or_pass(base, junk, field):
    """validate() answers any JSON with ManifestError or a manifest whose names and sources are safe."""
    instances = [dict(entry(f"k{i}"), **b) for i, b in enumerate(base)]
    if instances:
        instances[0][field] = junk
    for data in (_m(instances), junk, _m(junk)):
        try:
            out = validate(data)
        except ManifestError as e:
            assert str(e)
            continue
        for inst in out["instances"]:
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", inst["name"])
            assert not os.path.isabs(inst["source"]) and ".." not in inst["source"].split("/")
