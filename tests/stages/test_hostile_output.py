"""Hostile output places (issue 25): emit touches -o only once the specs are valid, writes atomically,
leaves the directory as it was on failure, removes only stale files its previous manifest listed, and
turns every failure into a clear error (exit 2); a bug prints one line and where the log is (exit 70)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import emitter.emit as em
from emitter.fsutil import OutputError
from tests.hostile_helpers import ROOT, assert_clean, cli, snapshot

SPEC = ROOT / "configs" / "gemm" / "sm80.yaml"
ONE = "arch: sm80\ndtype: f16\ntile: 128x128x32\n"


@pytest.fixture
def one(tmp_path):
    p = tmp_path / "one.yaml"
    p.write_text(ONE)
    return p


def test_out_under_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    code, out = cli("emit", SPEC, "-o", tmp_path / "file" / "sub")
    assert_clean(code, out, "file is a file, not a directory", "fix:")
    assert (tmp_path / "file").read_text() == "mine"


def test_out_is_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    code, out = cli("emit", SPEC, "-o", tmp_path / "file")
    assert_clean(code, out, "is a file")
    assert (tmp_path / "file").read_text() == "mine"


def test_manifest_path_is_a_directory(tmp_path):
    (tmp_path / "o" / "manifest.json").mkdir(parents=True)
    before = snapshot(tmp_path / "o")
    code, out = cli("emit", SPEC, "-o", tmp_path / "o")
    assert_clean(code, out, "manifest.json: error: is a directory", "fix:")
    assert snapshot(tmp_path / "o") == before


def test_manifest_path_is_a_symlink(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "victim.json").write_text("keep")
    (tmp_path / "o" / "manifest.json").symlink_to(tmp_path / "victim.json")
    code, out = cli("emit", SPEC, "-o", tmp_path / "o")
    assert_clean(code, out, "is a symlink")
    assert (tmp_path / "victim.json").read_text() == "keep"


def test_out_not_writable(tmp_path, monkeypatch):
    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == tmp_path / "ro" else real(p, mode))
    code, out = cli("emit", SPEC, "-o", tmp_path / "ro" / "out")
    assert_clean(code, out, "permission denied", "fix:")
    assert not (tmp_path / "ro" / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_out_not_writable_for_real(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, out = cli("emit", SPEC, "-o", ro / "out")
        assert_clean(code, out, "permission denied")
    finally:
        ro.chmod(0o700)


def test_bad_spec_creates_no_output_dir(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arch: sm80\ndtype: f16\ntile: 128x128x32\nstages: lots\n")
    code, out = cli("emit", bad, "-o", tmp_path / "a" / "b" / "c")
    assert_clean(code, out, f"{bad}:4: error")
    assert not (tmp_path / "a").exists()


def _enospc_after(monkeypatch, n: int):
    real = em.atomic_write_bytes
    calls = {"n": 0}

    def full(path, data, **kw):
        calls["n"] += 1
        if calls["n"] > n:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(em, "atomic_write_bytes", full)


@pytest.mark.parametrize("after", [0, 2, 5], ids=["first-file", "third-file", "at-manifest"])
def test_disk_full_leaves_a_new_dir_absent(tmp_path, monkeypatch, after):
    _enospc_after(monkeypatch, after)       # sm80.yaml emits 5 files, then the manifest
    code, out = cli("emit", SPEC, "-o", tmp_path / "new" / "out")
    assert_clean(code, out, "no space left on the device", "the directory is as it was", "fix:")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("after", [0, 1, 3], ids=["first-file", "second-file", "at-manifest"])
def test_disk_full_leaves_an_old_dir_as_it_was(tmp_path, monkeypatch, one, after):
    out_dir = tmp_path / "o"
    assert cli("emit", SPEC, "-o", out_dir)[0] == 0
    (out_dir / "notes.txt").write_text("mine")
    before = snapshot(out_dir)
    spec2 = tmp_path / "two.yaml"
    spec2.write_text("arch: sm80\ndtype: [f16, bf16]\ntile: [128x128x32, 64x64x32]\n")
    _enospc_after(monkeypatch, after)
    code, out = cli("emit", spec2, "-o", out_dir)
    assert_clean(code, out, "no space left")
    assert snapshot(out_dir) == before, "a failed emit must leave the directory as it was"


def test_stale_files_of_the_previous_manifest_are_removed(tmp_path, one):
    out_dir = tmp_path / "o"
    assert cli("emit", SPEC, "-o", out_dir)[0] == 0
    old = {p.name for p in out_dir.glob("*.cu")}
    (out_dir / "notes.txt").write_text("mine")
    (out_dir / "hand_written.cu").write_text("// mine")
    code, out = cli("emit", one, "-o", out_dir)
    assert code == 0 and "stale .cu removed" in out, out
    data = json.loads((out_dir / "manifest.json").read_text())
    now = {p.name for p in out_dir.glob("*.cu")}
    assert now == {e["source"] for e in data["instances"]} | {"hand_written.cu"}
    assert old - now and (out_dir / "notes.txt").read_text() == "mine"


def test_keep_stale_lists_them(tmp_path, one):
    out_dir = tmp_path / "o"
    assert cli("emit", SPEC, "-o", out_dir)[0] == 0
    old = {p.name for p in out_dir.glob("*.cu")}
    code, out = cli("emit", one, "-o", out_dir, "--keep-stale")
    assert code == 0 and "stale (kept, not in the manifest)" in out and "stale .cu kept" in out, out
    assert old <= {p.name for p in out_dir.glob("*.cu")}


@pytest.mark.parametrize("source", ["../victim.cu", "/abs/victim.cu", "notes.txt", "sub/x.cu"])
def test_stale_removal_never_touches_what_emitter_did_not_write(tmp_path, one, source):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (tmp_path / "victim.cu").write_text("keep")
    (out_dir / "notes.txt").write_text("keep")
    (out_dir / "sub").mkdir()
    (out_dir / "sub" / "x.cu").write_text("keep")
    name = Path(source).stem
    (out_dir / "manifest.json").write_text(json.dumps({"schema_version": 1, "instances": [
        {"name": name, "source": source}, {"name": "../victim", "source": "../victim.cu"}], "rejected": []}))
    before_out = snapshot(tmp_path)
    code, out = cli("emit", one, "-o", out_dir)
    assert code == 0, out
    after = snapshot(tmp_path)
    for rel, h in before_out.items():
        if rel in ("o/manifest.json",):
            continue
        assert after.get(rel) == h, rel


def test_stale_symlink_is_not_followed(tmp_path, one):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (tmp_path / "victim.cu").write_text("keep")
    (out_dir / "gemm_x.cu").symlink_to(tmp_path / "victim.cu")
    (out_dir / "manifest.json").write_text(json.dumps({"schema_version": 1, "instances": [
        {"name": "gemm_x", "source": "gemm_x.cu"}], "rejected": []}))
    assert cli("emit", one, "-o", out_dir)[0] == 0
    assert (tmp_path / "victim.cu").read_text() == "keep"


def test_garbage_previous_manifest_is_replaced_without_deleting(tmp_path, one):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    (out_dir / "manifest.json").write_text("[[[[ not json")
    (out_dir / "gemm_old.cu").write_text("keep")
    code, out = cli("emit", one, "-o", out_dir)
    assert code == 0, out
    assert (out_dir / "gemm_old.cu").read_text() == "keep"
    assert json.loads((out_dir / "manifest.json").read_text())["instances"]


def test_staging_dir_of_a_killed_emit_is_pruned(tmp_path, one):
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    dead = out_dir / ".emitter-stage-999999999.abc"
    dead.mkdir()
    (dead / "half.cu").write_text("x")
    assert cli("emit", one, "-o", out_dir)[0] == 0
    assert not dead.exists()
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]


def test_no_temporaries_left_after_success(tmp_path):
    assert cli("emit", SPEC, "-o", tmp_path / "o")[0] == 0
    assert not [p for p in (tmp_path / "o").iterdir() if p.name.startswith(".")]


def test_output_error_is_an_emitter_error_with_exit_2():
    e = OutputError("/x", "boom", "do this")
    assert e.exit_code == 2 and "/x: error: boom" in e.render() and "fix:     do this" in e.render()


def test_internal_error_prints_one_line_and_logs(tmp_path, monkeypatch, one):
    def boom(*a, **kw):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(em, "expand_specs", boom)
    monkeypatch.setenv("EMITTER_LOG_DIR", str(tmp_path / "logs"))
    code, out = cli("emit", one, "-o", tmp_path / "o")
    assert_clean(code, out, "internal error (a bug): RuntimeError: planted bug", "full traceback in", exit_code=70)
    assert len(out.strip().splitlines()) == 1
    [log] = (tmp_path / "logs").iterdir()
    assert "Traceback" in log.read_text() and "planted bug" in log.read_text()
