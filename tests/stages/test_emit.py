"""emit end to end (no nvcc): manifest schema, determinism, atomicity, naming, CLI behaviour."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.cli import main
from emitter.emit import emit
from emitter.manifest import SCHEMA_VERSION, load

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "gemm").glob("*.yaml"))

SWEEP = """
kernels:
  - arch: sm90a
    dtype: [bf16, f16, e4m3]
    layout: [tn, nn]
    tile: [64x128x64, 128x128x64, 128x256x64, 96x128x64, 128x128x48]
    cluster: [1x1x1, 2x1x1]
    schedule: {kernel: [cooperative, pingpong]}
  - arch: sm80
    dtype: [f16, bf16, f32]
    tile: [128x128x32, 128x128x48, 64x64x32]
    stages: [3, 4]
"""


@pytest.fixture
def sweep(tmp_path):
    p = tmp_path / "sweep.yaml"
    p.write_text(SWEEP)
    return p


def test_manifest_schema(tmp_path, sweep):
    res = emit([sweep], tmp_path / "out")
    data = load(tmp_path / "out")
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["instances"] and data["rejected"], "this sweep has both accepted and rejected configurations"
    for inst in data["instances"]:
        assert set(inst) >= {"name", "family", "arch", "source", "spec", "spec_hash", "config"}
        assert (tmp_path / "out" / inst["source"]).is_file()
        assert inst["family"] == "gemm" and re.fullmatch(r"[0-9a-f]{64}", inst["spec_hash"])
        cfg = inst["config"]
        assert cfg["arch"] == inst["arch"]
        assert cfg["stages"] is not None and cfg["alignment_a"] > 0 and cfg["instruction"] is not None
    for rej in data["rejected"]:
        assert rej["rule"] and rej["reason"] and rej["config"]
    assert len(res.instances) == len(data["instances"])


def test_names_are_unique_c_identifiers_and_file_names(tmp_path, sweep):
    data = emit([sweep], tmp_path / "out").manifest
    names = [i["name"] for i in data["instances"]]
    assert len(names) == len(set(names))
    for inst in data["instances"]:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", inst["name"])
        assert inst["source"] == inst["name"] + ".cu"
        text = (tmp_path / "out" / inst["source"]).read_text()
        assert f"emitter_{inst['name']}_kernel" in text


def test_same_input_gives_byte_identical_output(tmp_path, sweep):
    emit([sweep], tmp_path / "a")
    emit([sweep], tmp_path / "b")
    files_a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files_a == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in files_a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_reemit_rewrites_nothing_unchanged(tmp_path, sweep):
    first = emit([sweep], tmp_path / "out")
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.cu")}
    second = emit([sweep], tmp_path / "out")
    assert first.written == len(first.instances) and second.written == 0
    assert mtimes == {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.cu")}


def test_rejection_names_rule_and_fix(tmp_path, sweep):
    data = emit([sweep], tmp_path / "out").manifest
    k48 = [r for r in data["rejected"] if r["config"]["tile"][2] == 48]
    assert k48, "tile k=48 must be rejected"
    assert all("48" in r["reason"] for r in k48)


def test_banner(tmp_path, sweep):
    data = emit([sweep], tmp_path / "out").manifest
    inst = data["instances"][0]
    head = (tmp_path / "out" / inst["source"]).read_text()[:800]
    assert "emitter 0.1.0" in head and "do not edit" in head and inst["spec_hash"] in head
    assert "sweep.yaml" in head


def test_render_failure_does_not_stop_the_batch(tmp_path, sweep, monkeypatch):
    import emitter.emit as em

    real = em.render_instance
    calls = {"n": 0}

    def flaky(r):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("planted template failure")
        return real(r)

    monkeypatch.setattr(em, "render_instance", flaky)
    res = em.emit([sweep], tmp_path / "out")
    assert len(res.failed) == 1 and "planted" in res.failed[0]["error"]
    assert len(res.instances) >= 2
    data = load(tmp_path / "out")
    assert data["failed"][0]["name"] == res.failed[0]["name"]
    assert not (tmp_path / "out" / (res.failed[0]["name"] + ".cu")).exists()


def test_crash_mid_write_keeps_the_old_manifest(tmp_path, sweep, monkeypatch):
    emit([sweep], tmp_path / "out")
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    import emitter.fsutil as fs

    def killed(src, dst):
        raise KeyboardInterrupt("killed while replacing")

    monkeypatch.setattr(fs.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        fs.atomic_write_text(tmp_path / "out" / "manifest.json", "{ half")
    monkeypatch.undo()
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_example_configs_emit(tmp_path):
    res = emit(CONFIGS, tmp_path / "out")
    assert len(res.instances) >= 12 and not res.failed
    archs = {r.instance.arch.yaml for r in res.instances}
    assert archs == {"sm80", "sm90a"}


def test_tuning_configs_emit_without_rejections(tmp_path):
    """The benchmark's set (configs/gemm/sm90a_*.yaml, configs/tuning: candidates and explore) must not lose a
    kernel to a rule on the device: every entry resolves, and the swept keys give distinct instances."""
    tuning = sorted((ROOT / "configs" / "tuning").glob("*.yaml"))
    specs = tuning + sorted((ROOT / "configs" / "gemm").glob("sm90a_*.yaml"))
    res = emit(specs, tmp_path / "out")
    assert len(tuning) >= 2 and not res.failed and not res.rejected, [(r.rule, r.reason) for r in res.rejected]
    names = [r.name for r in res.instances]
    assert len(names) == len(set(names))
    assert any("_c2x1x1_" in n for n in names) and any("_promoovl_" in n for n in names)
    # swizzle is a run-time option of the compiled kernels (profile `scheduler:`), not compiled twins
    assert not any("_swz" in n for n in names)


def test_cli_emit_and_list(tmp_path, sweep):
    r = CliRunner().invoke(main, ["emit", str(sweep), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "emitted" in r.output and "rejected" in r.output
    r = CliRunner().invoke(main, ["list", str(tmp_path / "out")])
    assert r.exit_code == 0 and "rejected" in r.output


def test_cli_bad_spec_exit_2_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arch: sm90a\ndtype: bf16\ntile: 128x128x64\nstages: lots\n")
    proc = subprocess.run([sys.executable, "-m", "emitter", "emit", str(bad), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:4: error" in proc.stderr and "stages" in proc.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_cli_list_without_manifest(tmp_path):
    r = CliRunner().invoke(main, ["list", str(tmp_path)])
    assert r.exit_code == 2 and "no manifest" in r.output


@pytest.mark.parametrize("parallel", [False, True])
def test_an_instance_two_specs_reach_names_the_first_spec_every_run(tmp_path, monkeypatch, parallel):
    """Two spec files that give the same instance: its .cu banner names the first file (spec order), the same
    bytes every run, whichever worker wrote last."""
    import emitter.emit as emit_mod

    spec = "family: gemm\narch: sm80\ndtype: f16\nlayout: tn\ntile: 128x128x32\nwarp: 64x64x32\nstages: 3\n"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(spec)
    b.write_text(spec)
    if parallel:
        monkeypatch.setattr(emit_mod, "PARALLEL_THRESHOLD", 0)
    seen = set()
    for i in range(3):
        res = emit([a, b], tmp_path / f"out{i}", jobs=2 if parallel else 1)
        (entry,) = res.manifest["instances"]
        text = (tmp_path / f"out{i}" / entry["source"]).read_text()
        banner = next(line for line in text.splitlines() if "generated by emitter" in line)
        assert "a.yaml" in banner and "b.yaml" not in banner, banner
        seen.add(text)
    assert len(seen) == 1
