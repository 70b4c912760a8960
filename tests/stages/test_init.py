"""`emitter init`: a starter project per GPU, never written over existing files; the GPU found by nvidia-smi."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import emitter
from emitter.cli import main
from emitter.profile.config import load_config
from emitter.starter import InitError, detect_gpu, write_starter


def _smi(stdout: str = "", rc: int = 0, exc: Exception | None = None):
    def run(argv, **kw):
        assert argv[0] == "nvidia-smi" and "--query-gpu=name,compute_cap" in argv
        if exc:
            raise exc
        return subprocess.CompletedProcess(argv, rc, stdout, "")
    return run


@pytest.mark.parametrize("out, arch, words", [
    ("NVIDIA H100 80GB HBM3, 9.0\n", "sm90a", "H100"),
    ("NVIDIA H200, 9.0\nNVIDIA H200, 9.0\n", "sm90a", "H200"),
    ("NVIDIA A100-SXM4-40GB, 8.0\n", "sm80", "A100"),
    ("NVIDIA GeForce RTX 4090, 8.9\n", "sm80", "RTX 4090"),
    ("NVIDIA B200, 10.0\n", "sm80", "PTX"),
    ("", "sm80", "no GPU"),
])
def test_detect_gpu_maps_compute_capability(out, arch, words):
    got, reason = detect_gpu(_smi(out))
    assert got == arch and words in reason


def test_detect_gpu_without_nvidia_smi_or_on_an_old_gpu():
    assert detect_gpu(_smi(exc=FileNotFoundError("nvidia-smi")))[0] == "sm80"
    assert detect_gpu(_smi("junk", rc=9))[0] == "sm80"
    with pytest.raises(InitError, match="8.0 or newer") as e:
        detect_gpu(_smi("Tesla T4, 7.5\n"))
    assert "--gpu sm80" in e.value.render()


@pytest.mark.parametrize("gpu, n_instances, arch", [("sm80", 3, "sm80"), ("sm90a", 2, "sm90a")])
def test_starter_project_emits_for_its_gpu(tmp_path, gpu, n_instances, arch):
    r = write_starter(tmp_path / "proj", gpu)
    assert r.gpu == arch and sorted(p.name for p in r.written) == ["README.md", "profile.yaml", "specs.yaml"]
    res = emitter.emit_specs(tmp_path / "proj" / "specs.yaml", out=tmp_path / "proj" / "generated")
    assert len(res.instances) == n_instances and {i.instance.arch.yaml for i in res.instances} == {arch}
    cfg = load_config(tmp_path / "proj" / "profile.yaml")      # the shipped profile config parses
    assert cfg.manifests == ("generated",) and cfg.problems
    readme = (tmp_path / "proj" / "README.md").read_text()
    assert "emitter emit specs.yaml -o generated" in readme and "emitter verify generated" in readme


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "profile.yaml").write_text("mine\n")
    res = CliRunner().invoke(main, ["init", str(proj), "--gpu", "sm80"])
    assert res.exit_code == 2, res.output
    assert "already holds profile.yaml" in res.output and "nothing was written" in res.output
    assert "Traceback" not in res.output
    assert sorted(p.name for p in proj.iterdir()) == ["profile.yaml"]
    assert (proj / "profile.yaml").read_text() == "mine\n"


def test_init_cli_auto_and_next_steps(tmp_path, monkeypatch):
    monkeypatch.setattr("emitter.starter.subprocess.run", _smi("NVIDIA H100 80GB HBM3, 9.0\n"))
    res = CliRunner().invoke(main, ["init", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "H100" in res.output and "next:" in res.output and "emitter emit specs.yaml" in res.output
    assert "arch: sm90a" in (tmp_path / "p" / "specs.yaml").read_text()
    bad = CliRunner().invoke(main, ["init", str(tmp_path / "q"), "--gpu", "sm70"])
    assert bad.exit_code == 2 and not (tmp_path / "q").exists()


def test_init_into_a_file_is_an_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(InitError, match="not a directory"):
        write_starter(f, "sm80")
