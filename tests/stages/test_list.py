"""`emitter list` on any family's manifest (gemm, attention, conv) and on configs it does not know: the table
shows what each family's config offers, never an internal error; a malformed manifest is a clean exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.cli import main

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_helpers import SPEC  # noqa: E402


def run(*args) -> tuple[int, str]:
    r = CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "400"})   # rich folds names otherwise
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def gemm_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemm")
    (d / "s.yaml").write_text(SPEC)
    code, out = run("emit", d / "s.yaml", "-o", d / "g", "-q")
    assert code == 0, out
    return d / "g"


@pytest.mark.parametrize("spec,family,tile", [("configs/attention/sm80.yaml", "attention", "64x64"),
                                              ("configs/conv/sm80_resnet50.yaml", "conv", "128x128x64")])
def test_list_other_families(tmp_path, spec, family, tile):
    code, out = run("emit", ROOT / spec, "-o", tmp_path / "g", "-q")
    assert code == 0, out
    data = json.loads((tmp_path / "g" / "manifest.json").read_text())
    code, out = run("list", tmp_path / "g")
    assert code == 0, out
    assert "internal error" not in out and f"({family})" in out and f" {tile} " in out
    assert f"{len(data['instances'])} instances in" in out
    for inst in data["instances"]:
        assert inst["name"] in out
    code, out = run("list", tmp_path / "g", "--json")
    assert code == 0 and len(json.loads(out)["instances"]) == len(data["instances"])


def _rewrite(src: Path, dst: Path, edit) -> Path:
    data = json.loads((src / "manifest.json").read_text())
    edit(data)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "manifest.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("config", [{}, {"tile": "abc"}, {"tile": [1, {"x": 2}], "stages": {"a": [1, 2]}},
                                    {"tile_q": 64, "tile_kv": None, "stages": True, "z": [[1], [2, "x"]]}],
                         ids=["empty", "tile-str", "nested", "attention-like"])
def test_list_configs_it_does_not_know(gemm_dir, tmp_path, config):
    def edit(data):
        data["instances"][0]["config"] = config
        for rej in data["rejected"]:
            rej["config"] = config
    d = _rewrite(gemm_dir, tmp_path / "m", edit)
    code, out = run("list", d)
    assert code == 0, out
    assert "internal error" not in out and "Traceback" not in out
    name = json.loads((d / "manifest.json").read_text())["instances"][0]["name"]
    assert name in out


def test_list_gemm_columns(gemm_dir):
    data = json.loads((gemm_dir / "manifest.json").read_text())
    code, out = run("list", gemm_dir)
    assert code == 0
    cfg = data["instances"][0]["config"]
    assert "(gemm)" in out and "x".join(map(str, cfg["tile"])) in out
    if data["rejected"]:
        rej = data["rejected"][0]["config"]
        assert f"{rej['a']}/{rej['b']}->{rej['d']}" in out


@pytest.mark.parametrize("config,kind", [([], "a list"), (5, "a number"), ("x", "a string")])
def test_list_malformed_config_exit_2(gemm_dir, tmp_path, config, kind):
    d = _rewrite(gemm_dir, tmp_path / "m", lambda data: data["instances"][0].__setitem__("config", config))
    code, out = run("list", d)
    assert code == 2 and "instances[0].config must be an object" in out and kind in out
    assert "internal error" not in out
