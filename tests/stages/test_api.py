"""The Python API (emitter/api.py, re-exported at the top level): each call, its records, its errors, and the
CLI commands that are thin layers over it. Build runs a stand-in nvcc (the real compiles are tests/stages/test_build.py's
and tests/stages/test_package.py's); verify and profile run the fake backend."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import emitter
from emitter.cli import main
from emitter.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]

SPEC = {"arch": "sm80", "dtype": "f16", "layout": "tn", "tile": "128x128x32", "warp": "64x64x32", "stages": 4,
        "epilogue": ["identity", "relu"]}
SPEC_YAML = """arch: sm80
dtype: f16
layout: tn
tile: 128x128x32
warp: 64x64x32
stages: 4
epilogue: [identity, relu]
"""


def test_top_level_exports_the_api():
    assert set(emitter.__all__) >= {"emit_specs", "build_instances", "verify_instances", "profile_instances",
                                    "export_library", "init_project", "resolve_specs", "YamlText", "EmitterError"}
    for name in emitter.__all__:
        assert getattr(emitter, name) is not None
    import importlib

    builder = importlib.import_module("emitter.build.builder")   # the stage modules stay importable
    assert callable(builder.build) and callable(emitter.build_instances) and not callable(emitter.build)


def test_emit_from_a_dict_text_and_file_gives_the_same_instances(tmp_path):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(SPEC_YAML)
    runs = {"dict": emitter.emit_specs(SPEC, out=tmp_path / "d"),
            "text": emitter.emit_specs(emitter.YamlText(SPEC_YAML), out=tmp_path / "t"),
            "file": emitter.emit_specs(spec_file, out=tmp_path / "f")}
    names = {k: [i.name for i in r.instances] for k, r in runs.items()}
    assert len(names["dict"]) == 2 and names["dict"] == names["text"] == names["file"]
    cus = {k: (tmp_path / k[0] / f"{names[k][0]}.cu").read_text().split("\n", 2)[2] for k in runs}
    assert cus["dict"] == cus["text"] == cus["file"]           # the same code below the provenance banner
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["specs"][0]["path"] == "<dict>" and m["instances"][0]["spec"] == "<dict>"
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["specs"][0]["path"] == "<string>"
    # a list of dicts is one spec file's list; several inputs mix freely
    two = emitter.emit_specs([SPEC, emitter.YamlText(SPEC_YAML.replace("128x128x32", "64x64x64")
                                                      .replace("64x64x32", "32x32x64"))], out=tmp_path / "m")
    assert len(two.instances) == 4


@pytest.mark.parametrize("bad, key, value", [
    ({**SPEC, "tile": "128x128"}, "tile", "128x128"),
    ({**SPEC, "stagess": 4}, "stagess", None),
    ({"kernels": [SPEC, {**SPEC, "arch": "sm99"}]}, "kernels[1].arch", "sm99"),
])
def test_dict_errors_match_the_file_errors_with_key_paths(tmp_path, bad, key, value):
    import yaml

    with pytest.raises(SpecError) as from_dict:
        emitter.emit_specs(bad, out=tmp_path / "d")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError) as from_file:
        emitter.emit_specs(f, out=tmp_path / "f")
    with pytest.raises(SpecError) as from_text:
        emitter.emit_specs(emitter.YamlText(yaml.safe_dump(bad), name="<mine>"), out=tmp_path / "t")
    d, fi, t = from_dict.value, from_file.value, from_text.value
    assert d.file == "<dict>" and t.file == "<mine>" and fi.file == str(f)
    assert d.key_path == fi.key_path == t.key_path and key in d.key_path
    assert d.message == fi.message == t.message and d.allowed == fi.allowed
    assert d.line is None and fi.line is not None and t.line == fi.line
    if value is not None:
        assert d.value == value
    assert not (tmp_path / "d" / "manifest.json").exists()


def test_python_values_yaml_cannot_hold_are_errors_with_the_key_path(tmp_path):
    with pytest.raises(SpecError) as e:
        emitter.emit_specs({**SPEC, "tile": {1: 2}}, out=tmp_path)
    assert e.value.key_path == "tile" and "keys must be strings" in e.value.message
    with pytest.raises(SpecError, match="not set"):
        emitter.emit_specs({**SPEC, "stages": {4}}, out=tmp_path)
    with pytest.raises(SpecError, match="no spec"):
        emitter.emit_specs([], out=tmp_path)
    loop: dict = {"arch": "sm80"}
    loop["kernels"] = [loop]
    with pytest.raises(SpecError, match="deeper than"):
        emitter.emit_specs(loop, out=tmp_path)
    # tuples are lists, as in YAML
    assert len(emitter.emit_specs({**SPEC, "epilogue": ("identity", "gelu")}, out=tmp_path / "t").instances) == 2


def test_resolve_specs_writes_nothing_and_reports_rejections(tmp_path):
    instances, rejected = emitter.resolve_specs(ROOT / "configs" / "demo.yaml")
    assert len(instances) == 3 and len(rejected) == 1 and rejected[0].rule == "warp-k-iterations"
    assert all(i.name.startswith("gemm_sm80_") for i in instances)


# ------------------------------------------------------------------------------------------------ build
FAKE_NVCC = """#!/bin/bash
for a in "$@"; do [ "$a" = --version ] && { echo "nvcc: stand-in for tests/stages/test_api.py, release 13.0"; exit 0; }; done
echo "$*" >> "$(dirname "$0")/calls.log"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "image" > "$out"
if [[ " $* " == *" -DEMITTER_DEVICE "* ]]; then
  echo "ptxas info    : Compiling entry function 'emitter_x_kernel' for 'sm_80'" >&2
  echo "ptxas info    : Used 200 registers, 0 bytes smem, 400 bytes cmem[0]" >&2
fi
"""


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("EMITTER_NVCC", str(nvcc))
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    return nvcc.parent / "calls.log"


def test_build_instances_returns_the_summary(tmp_path, fake_nvcc):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    s = emitter.build_instances(tmp_path / "g", jobs=2, select=["relu"])
    assert [r.status for r in s.results] == ["ok"] and s.skipped == 1 and not s.failed
    assert s.results[0].name.endswith("_relu") and s.results[0].record["resources"]["registers"] == 200
    device = [ln for ln in fake_nvcc.read_text().splitlines() if "-DEMITTER_DEVICE" in ln]
    assert len(device) == 1 and "code=[sm_80,compute_80]" in device[0] and " -fatbin " in device[0]
    # the stand-in "shim" is no shared library: its launch query cannot be asked, so the size is unknown, with why
    res = json.loads(Path(s.results[0].record_path).read_text())["resources"]
    assert res["dynamic_shared_bytes"] is None and res["dynamic_shared_reason"]
    again = emitter.build_instances(tmp_path / "g", select=["relu"])
    assert [r.status for r in again.results] == ["cached"]


def test_build_table_smem_adds_the_dynamic_bytes():
    from emitter.build.cli import _smem

    assert _smem({"shared_bytes": 0, "dynamic_shared_bytes": 49152}) == "48.0 KiB"
    assert _smem({"shared_bytes": 1024, "dynamic_shared_bytes": 65536}) == "65.0 KiB"
    assert _smem({"shared_bytes": 512, "dynamic_shared_bytes": None}) == "512+?"
    assert _smem({"shared_bytes": 512}) == "512"


def test_build_cli_is_a_thin_layer_over_the_api(tmp_path, fake_nvcc, monkeypatch):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    seen = {}
    real = emitter.api.build_instances

    def spy(out, **kw):
        seen.update(kw, out=out)
        return real(out, **kw)

    monkeypatch.setattr("emitter.build.cli.build_instances", spy)
    res = CliRunner().invoke(main, ["build", str(tmp_path / "g"), "-j", "1", "--select", "relu", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert seen["select"] == ("relu",) and seen["jobs"] == 1 and "built 1 instance" in res.output


# ------------------------------------------------------------------------------------ verify, profile (fake)
def test_verify_instances_with_the_fake_backend(tmp_path):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    run = emitter.verify_instances(tmp_path / "g", backend="fake", quick=True, seed=7, isolation=False)
    assert run.backend == "fake" and run.failed == 0 and len(run.instances) == 2
    assert run.results and {r["status"] for r in run.results} == {"PASSED"}
    assert (tmp_path / "g" / "verify" / "results.json").is_file() and (tmp_path / "g" / "verify" / "junit.xml").is_file()
    one = emitter.verify_instances(tmp_path / "g", backend="fake", problems=["256x128x64", (128, 64, 32)],
                                   select=["relu"], seed=7, isolation=False, data="int", write_reports=False)
    assert {r["instance"] for r in one.results} == {run.instances[1]} or len({r["instance"] for r in one.results}) == 1
    labels = {r["problem"] for r in one.results}
    assert any("256x128x64" in p for p in labels) and any("128x64x32" in p for p in labels)
    assert all(r["status"] == "PASSED" for r in one.results)
    with pytest.raises(SpecError, match="MxNxK"):
        emitter.verify_instances(tmp_path / "g", backend="fake", problems=["12x12"], isolation=False)


def test_verify_finds_a_planted_fault(tmp_path):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    name = emitter.resolve_specs(SPEC)[0][0].name
    run = emitter.verify_instances(tmp_path / "g", backend="fake", quick=True, seed=7, isolation=False,
                                   backend_options={"faults": [{"select": name, "kind": "wrong"}]},
                                   write_reports=False)
    assert run.failed > 0 and all(r["instance"] == name for r in run.results if r["status"] == "FAILED")


def test_profile_instances_from_a_manifest_and_from_a_config(tmp_path):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    rep = emitter.profile_instances(tmp_path / "g", problems=["1024x1024x1024", (256, 512, 128)], backend="fake",
                                    out=tmp_path / "r", backend_options={"isolate": False})
    assert {p.key for p in rep.config.problems} == {"1024x1024x1024", "256x512x128"}
    assert rep.choices and all(c is not None for c in rep.choices.values())
    assert (tmp_path / "r" / "tuning.json").is_file() and (tmp_path / "r" / "profile.csv").is_file()
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"manifests: [{tmp_path / 'g'}]\nproblems: [{{m: 512, n: 512, k: 512}}]\n")
    rep2 = emitter.profile_instances(cfg, backend="fake", backend_options={"isolate": False}, out=tmp_path / "r2")
    assert [p.key for p in rep2.config.problems] == ["512x512x512"]
    with pytest.raises(SpecError, match="needs problems"):
        emitter.profile_instances(tmp_path / "g", backend="fake")


def test_export_library_returns_the_export_record(tmp_path):
    emitter.emit_specs(SPEC, out=tmp_path / "g")
    r = emitter.export_library(tmp_path / "g", name="mykernels", out=tmp_path / "lib")
    assert r.name == "mykernels" and len(r.kernels) == 2 and (tmp_path / "lib" / "CMakeLists.txt").is_file()
    res = CliRunner().invoke(main, ["library", str(tmp_path / "g"), "--name", "mykernels", "-o", str(tmp_path / "lib")])
    assert res.exit_code == 0 and "library mykernels: 2 kernels" in res.output and "0 files written" in res.output


def test_init_project(tmp_path):
    r = emitter.init_project(tmp_path / "p", gpu="sm80")
    assert r.gpu == "sm80" and (tmp_path / "p" / "specs.yaml").is_file()


# ------------------------------------------------------------------------------------------ CLI: emit, list
def test_emit_cli_uses_the_api_and_list_previews_a_selection(tmp_path):
    res = CliRunner().invoke(main, ["emit", str(ROOT / "configs" / "demo.yaml"), "-o", str(tmp_path / "g")])
    assert res.exit_code == 0 and "emitted 3 instances" in res.output and "rejected 1" in res.output
    out = CliRunner().invoke(main, ["list", str(tmp_path / "g"), "--select", "tile=64x64x64", "--json"])
    data = json.loads(out.output)
    assert [i["config"]["tile"] for i in data["instances"]] == [[64, 64, 64]] and data["rejected"] == []
    table = CliRunner().invoke(main, ["list", str(tmp_path / "g"), "--select", "tile=128x*", "--exclude", "relu"])
    assert "1 of 3 instances" in table.output and "_identity" in table.output and "_relu" not in table.output
    typo = CliRunner().invoke(main, ["list", str(tmp_path / "g"), "--select", "tyle=128x*"])
    assert typo.exit_code == 2 and "no instance has the attribute 'tyle'" in typo.output


# ------------------------------------------------------------------------------------------------ GPU
def _gpu_skip_reason() -> str | None:
    try:
        import pycuda.driver as drv

        drv.init()
        return None if drv.Device.count() > 0 else "no CUDA device"
    except Exception as e:  # noqa: BLE001
        return f"no GPU / PyCUDA here: {e}"


@pytest.mark.gpu
@pytest.mark.nvcc
def test_api_builds_and_verifies_an_sm80_instance_on_this_gpu(tmp_path, monkeypatch):
    """The user's own sm80 build (fatbin: sm_80 SASS + compute_80 PTX) PASSES on whatever GPU is here, an H100
    included (the driver JIT-compiles the PTX), through the API's build and verify."""
    why = _gpu_skip_reason()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    emitter.emit_specs(ROOT / "configs" / "demo.yaml", out=tmp_path / "g")
    built = emitter.build_instances(tmp_path / "g", select=["tile=64x64x64"])
    assert [r.status for r in built.results] == ["ok"], [r.error for r in built.failed]
    rec = built.results[0].record
    assert rec["artifacts"]["cubin"].endswith(".fatbin") and rec["resources"]["dynamic_shared_bytes"] == 49152
    run = emitter.verify_instances(tmp_path / "g", select=["tile=64x64x64"], quick=True, backend="pycuda")
    print(f"\n{run.device}: " + ", ".join(f"{r['problem']} {r['status']}" for r in run.results))
    assert run.results and all(r["status"] == "PASSED" for r in run.results), \
        [(r["problem"], r["status"], r.get("reason")) for r in run.results if r["status"] != "PASSED"]
