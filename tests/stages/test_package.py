"""The package as a user installs it: the wheel ships templates/ and configs/ (every family's, by glob), and a
fresh virtual environment with only that wheel runs init, emit, build (one real sm80 instance) and a library
export from a directory outside the checkout (issue 26: every other test runs on the editable install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q",
                        "-w", str(out)], capture_output=True, text=True, cwd=out)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list(out.glob("emitter-*.whl"))
    assert len(wheels) == 1, wheels
    print(f"\nwheel built in {time.perf_counter() - t0:.1f} s: {wheels[0].name}")
    return wheels[0]


def _shipped(folder: str, patterns: tuple[str, ...]) -> set[str]:
    """The files of a top-level folder that the package-data globs in pyproject.toml take."""
    base = ROOT / folder
    return {f"emitter/{folder}/{p.relative_to(base).as_posix()}" for pat in patterns for p in base.glob(f"**/{pat}")
            if p.is_file() and "__pycache__" not in p.parts}


def test_wheel_ships_every_template_and_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = _shipped("templates", ("*.j2", "*.h", "*.cuh", "*.hpp", "*.in"))
    configs = _shipped("configs", ("*.yaml", "*.yml", "*.md"))
    assert "emitter/templates/common/emitter_abi.h" in templates and "emitter/configs/demo.yaml" in configs
    assert not templates - names, f"templates missing from the wheel: {sorted(templates - names)[:10]}"
    assert not configs - names, f"configs missing from the wheel: {sorted(configs - names)[:10]}"
    # every family folder that exists ships (templates/<family>/..., configs/<family>/...)
    for fam in (p.name for p in (ROOT / "templates").iterdir() if p.is_dir()):
        assert any(n.startswith(f"emitter/templates/{fam}/") for n in names), fam
    assert any(n.startswith("emitter/families/") and n.endswith("registry.py") for n in names)
    assert not any(n.startswith(("templates/", "configs/", "tests/")) for n in names)


def _run(argv, cwd, env, timeout=900):
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"$ {' '.join(map(str, argv))}   (in {cwd}, exit {r.returncode})\n{(r.stdout + r.stderr).strip()[-1500:]}")
    return r


@pytest.mark.nvcc
def test_fresh_venv_from_the_wheel_works_outside_the_checkout(wheel, tmp_path):
    from emitter.build.nvcc import find_nvcc
    from emitter.cutlass_path import find_cutlass

    try:
        nvcc = find_nvcc()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"nvcc not found: {e}")
    venv = tmp_path / "venv"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)   # no --system-site-packages
    py, cli = venv / "bin" / "python", venv / "bin" / "emitter"
    # the wheel with its dependencies from the index (pip's cache on a warm machine); nvidia-cutlass is an extra,
    # so the headers come from CUTLASS_PATH below, as a user with a CUTLASS checkout would have them
    r = _run([py, "-m", "pip", "install", "-q", str(wheel)], tmp_path, os.environ.copy())
    assert r.returncode == 0
    print(f"fresh venv + install: {time.perf_counter() - t0:.1f} s")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUTLASS_PATH", "VIRTUAL_ENV")}
    env.update(EMITTER_CACHE_DIR=str(tmp_path / "cache"), EMITTER_NVCC=nvcc, PATH=f"{venv / 'bin'}:{env['PATH']}")

    # installed from the wheel, not the checkout
    r = _run([py, "-c", "import emitter, emitter.resources as r; print(emitter.__file__); print(r.templates_root()); "
                        "print(r.configs_root()); print(len(r.example_specs('gemm')))"], work, env)
    assert r.returncode == 0 and str(ROOT) not in r.stdout and str(venv) in r.stdout.splitlines()[0]
    assert int(r.stdout.split()[-1]) >= 1

    assert _run([cli, "init", "proj", "--gpu", "sm80"], work, env).returncode == 0
    proj = work / "proj"
    r = _run([cli, "emit", "specs.yaml", "-o", "generated"], proj, env)
    assert r.returncode == 0 and "emitted 3 instances" in r.stdout and "rejected 1" in r.stdout

    # without headers: a clear error that names the fix, exit 2, no traceback
    r = _run([cli, "build", "generated", "--select", "tile=64x64x64"], proj, env)
    assert r.returncode == 2 and "pip install nvidia-cutlass==4.2.0.0 --no-deps" in r.stderr
    assert "Traceback" not in r.stderr

    env["CUTLASS_PATH"] = str(find_cutlass().root)
    t1 = time.perf_counter()
    r = _run([cli, "build", "generated", "--select", "tile=64x64x64", "-j", "1", "--no-progress"], proj, env)
    assert r.returncode == 0 and "built 1 instance: 1 compiled" in r.stdout
    print(f"one sm80 instance built in {time.perf_counter() - t1:.1f} s")
    # dynamic shared memory from the shim's launch query: 64x64x64 tiles x 3 stages of f16 A and B = 48 KiB
    assert "48.0 KiB" in r.stdout
    rec = json.loads(next((proj / "generated" / "build").glob("*/record.json")).read_text())
    assert rec["resources"]["dynamic_shared_bytes"] == 3 * (64 * 64 + 64 * 64) * 2
    images = list((proj / "generated" / "build").glob("*/*.fatbin"))
    assert len(images) == 1 and images[0].read_bytes()[:4] == bytes.fromhex("50ed55ba")   # SASS + PTX

    r = _run([cli, "library", "generated", "--select", "tile=64x64x64", "--name", "mykernels", "-o", "lib"], proj, env)
    assert r.returncode == 0 and "library mykernels: 1 kernels" in r.stdout
    assert (proj / "lib" / "CMakeLists.txt").is_file()

    # the Python API from the installed package: a dict spec, with a key-path error for a bad one
    r = _run([py, "-c", "import emitter\n"
                        "r = emitter.emit_specs({'arch': 'sm80', 'dtype': 'bf16', 'layout': 'tn', 'tile': '128x128x32',"
                        " 'warp': '64x64x32', 'stages': 4}, out='api')\n"
                        "print(len(r.instances), r.manifest['specs'][0]['path'])\n"
                        "try:\n    emitter.emit_specs({'arch': 'sm80', 'tile': 'x'}, out='api2')\n"
                        "except emitter.SpecError as e:\n    print('ERR', e.file, e.key_path)\n"], proj, env)
    assert r.returncode == 0 and "1 <dict>" in r.stdout and "ERR <dict>" in r.stdout
