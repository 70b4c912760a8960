"""Shared pieces of the hostile-input suites (tests/stages/test_hostile_*.py): running the CLI, snapshots of a
directory tree, and a fake nvcc so `emitter build` runs without compiling anything."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from emitter.cli import main

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None):
    """Run `emitter ARGS` in-process: (exit code, stdout + stderr)."""
    r = CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=True)
    assert r.exception is None or isinstance(r.exception, SystemExit), f"{type(r.exception)}: {r.exception}"
    return r.exit_code, r.output


def cli_proc(*args: str, env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run `python -m emitter ARGS` in a fresh process (for the bounded-time and no-traceback checks)."""
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "emitter", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env=full)


def assert_clean(code: int, output: str, *pieces: str, exit_code: int = 2) -> None:
    assert "Traceback" not in output, output
    assert code == exit_code, (code, output)
    for p in pieces:
        assert p in output, f"{p!r} not in:\n{output}"


def snapshot(path: Path) -> dict[str, str]:
    """Every file, directory and symlink under `path` with its content hash (or link target)."""
    out: dict[str, str] = {}
    if not path.exists() and not path.is_symlink():
        return out
    for dirpath, dirs, files in os.walk(path):
        for d in dirs:
            p = Path(dirpath) / d
            out[str(p.relative_to(path))] = "link:" + os.readlink(p) if p.is_symlink() else "dir"
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                out[str(p.relative_to(path))] = "link:" + os.readlink(p)
            else:
                out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


FAKE_NVCC = r"""#!/usr/bin/env python3
# A stand-in for nvcc: writes `-o OUT` with bytes derived from the source (no compile). Logs each call.
import os, sys
args = sys.argv[1:]
if "--version" in args:
    print("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88 (fake)")
    sys.exit(0)
with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
    log.write(os.getcwd() + " " + " ".join(args) + "\n")
out = args[args.index("-o") + 1]
src = args[-1]
data = open(src, "rb").read()
kind = b"cubin" if "-DEMITTER_DEVICE" in args else b"host"
with open(out, "wb") as f:
    f.write(kind + b":" + data)
sys.exit(0)
"""


def install_fake_nvcc(tmp_path: Path, monkeypatch) -> Path:
    """EMITTER_NVCC -> the fake; a private cache; returns the call log path."""
    from emitter.build import nvcc as nvcc_mod

    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    log = tmp_path / "nvcc_calls.log"
    monkeypatch.setenv("EMITTER_NVCC", str(nvcc))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    nvcc_mod.nvcc_version.cache_clear()
    return log


def nvcc_calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def write_manifest(out: Path, instances: list[dict], *, sources: dict[str, str] | None = None,
                   rejected: list | None = None) -> Path:
    """A manifest with the given instance entries (written as given: they may be hostile)."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, text in (sources or {}).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    (out / "manifest.json").write_text(json.dumps({
        "schema_version": 1, "emitter_version": "0.1.0", "specs": [], "instances": instances,
        "rejected": rejected if rejected is not None else []}, indent=1))
    return out


def entry(name, source=None, **over) -> dict:
    e = {"name": name, "family": "gemm", "arch": "sm80", "source": source if source is not None else f"{name}.cu",
         "spec": "t.yaml", "spec_hash": "0" * 64, "config": {"tile": [128, 128, 32], "a": "f16"}}
    e.update(over)
    return e
