"""emitter build with real nvcc on tiny .cu files (about a second each), plus the pieces it is made of.

Each tiny instance follows the emitted-.cu convention: the device entry under #ifdef EMITTER_DEVICE,
the host function otherwise. nvcc runs through a wrapper that logs every compile, so "no nvcc ran" is
checked by a counter, not by timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from emitter.build import BuildOptions, build
from emitter.build import nvcc as nvcc_mod
from emitter.build import ptxas
from emitter.build.builder import _analyse, _Plan
from emitter.build.cache import Cache, cache_root
from emitter.build.cli import register
from emitter.build.resources import default_jobs, mem_available
from emitter.cutlass_path import find_cutlass
from emitter.errors import CutlassNotFound

ROOT = Path(__file__).resolve().parents[2]
from tests._helpers import NVCC_REQUIRED as _NVCC_REQUIRED, nvcc_path  # noqa: E402

REAL_NVCC = nvcc_path()
# on CI a missing nvcc fails these tests (conftest) instead of skipping them
needs_nvcc = pytest.mark.skipif(REAL_NVCC is None and not _NVCC_REQUIRED, reason="nvcc not found")

# Seen from nvcc 13.0 on a CUTLASS 3.x sm90a cooperative kernel built without -DNDEBUG.
C7510_LOG = """\
ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to wgmma pipeline crossing function boundary at a function call in the function 'poc_entry_g'
ptxas info    : 3667 bytes gmem
ptxas info    : Compiling entry function 'poc_entry_g' for 'sm_90a'
ptxas info    : Function properties for poc_entry_g
    64 bytes stack frame, 64 bytes spill stores, 280 bytes spill loads
ptxas info    : Used 168 registers, used 2 barriers, 64 bytes cumulative stack size
ptxas info    : Compile time = 382.121 ms
"""
CLEAN_LOG = """\
ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'emitter_k_kernel' for 'sm_90a'
ptxas info    : Function properties for emitter_k_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 2 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""


def tiny_cu(name: str, body: str = "p[threadIdx.x] = 1.0f;", extra: str = "") -> str:
    return (f"// tiny test instance {name}\n#ifdef EMITTER_DEVICE\n"
            f"extern \"C\" __global__ void emitter_{name}_kernel(float* p) {{ {body} }}\n"
            f"#else\nextern \"C\" int emitter_{name}_query(void) {{ return 0; }}\n#endif\n{extra}")


def write_manifest(out: Path, sources: dict[str, str], arch: str = "sm80", configs: dict[str, dict] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    instances = []
    for name, text in sources.items():
        (out / f"{name}.cu").write_text(text)
        cfg = (configs or {}).get(name, {"tile": [128, 128, 32], "a": "f16"})
        instances.append({"name": name, "family": "gemm", "arch": arch, "source": f"{name}.cu",
                          "spec": "test.yaml", "spec_hash": "0" * 64, "config": cfg})
    (out / "manifest.json").write_text(json.dumps({
        "schema_version": 1, "emitter_version": "0.1.0", "generated_at": None, "specs": [],
        "instances": instances, "rejected": []}, indent=1))
    return out


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A private cache and an nvcc wrapper that logs each compile (not --version) to a counter file."""
    if REAL_NVCC is None:
        pytest.skip("nvcc not on PATH")
    counter = tmp_path / "nvcc_calls.log"
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f"""#!/bin/bash
for a in "$@"; do [ "$a" = --version ] && exec {REAL_NVCC} "$@"; done
echo "$*" >> {counter}
if [ -n "$FAKE_PTXAS_LINE" ] && [[ " $* " == *" -DEMITTER_DEVICE "* ]]; then
  {REAL_NVCC} "$@"; rc=$?; echo "$FAKE_PTXAS_LINE" >&2; exit $rc
fi
if [ -n "$SLOW_MARKER" ] && [[ " $* " == *"$SLOW_SOURCE"* ]]; then
  {REAL_NVCC} "$@"; rc=$?; touch "$SLOW_MARKER"; sleep 60; exit $rc
fi
exec {REAL_NVCC} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("EMITTER_NVCC", str(wrapper))
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FAKE_PTXAS_LINE", raising=False)

    class Env:
        cache = tmp_path / "cache"

        @staticmethod
        def calls() -> int:
            return len(counter.read_text().splitlines()) if counter.exists() else 0

    return Env


def records(out: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((out / "build").glob("*/record.json"))}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def assert_intact(out: Path, cache_dir: Path) -> None:
    """Every record that vouches for artifacts names a complete cache entry holding exactly those bytes."""
    cache = Cache(cache_dir)
    for name, rec in records(out).items():
        if rec["status"] == "failed":
            assert rec["artifacts"] == {"cubin": None, "host": None}
            continue
        entry = cache.lookup(rec["cache_key"])
        assert entry is not None, f"{name}: no cache entry for its record"
        for kind in ("cubin", "host"):
            assert _sha(out / rec["artifacts"][kind]) == entry.meta["files"][kind]["sha256"], (name, kind)
    for meta in cache.entries.glob("*/*/meta.json"):
        assert cache.lookup(meta.parent.name) is not None, f"damaged cache entry {meta.parent}"


# ----------------------------------------------------------------------------------------- build
@needs_nvcc
def test_build_writes_artifacts_and_record(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b")})
    summary = build(out)
    assert summary.ok and [r.status for r in summary.results] == ["ok", "ok"]
    assert env.calls() == 4                                   # device + host per instance
    rec = records(out)["k_a"]
    assert rec["schema_version"] == 1 and rec["name"] == "k_a" and rec["status"] == "ok"
    assert rec["error"] is None and rec["wall_s"] > 0 and len(rec["cache_key"]) == 64
    # sm80: the device image is a fatbin (SASS + PTX, so it also runs on newer GPUs; magic 0xba55ed50)
    assert rec["artifacts"] == {"cubin": "build/k_a/k_a.fatbin", "host": "build/k_a/libk_a.so"}
    assert (out / rec["artifacts"]["cubin"]).read_bytes()[:4] == bytes.fromhex("50ed55ba")
    assert (out / rec["artifacts"]["host"]).read_bytes()[:4] == b"\x7fELF"
    device, host = rec["commands"]
    for flag in ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr"):
        assert flag in device and flag in host
    # the kernel's image carries sm_80 SASS + its PTX; the shim (no kernels) SASS only
    assert "-gencode=arch=compute_80,code=[sm_80,compute_80]" in device and "-gencode=arch=compute_80,code=sm_80" in host
    assert "-DEMITTER_DEVICE" in device and "-fatbin" in device and "-Xptxas=-v" in device
    assert "-DEMITTER_DEVICE" not in host and "--shared" in host and "-fPIC" in host
    assert device[-3:] == ["-o", "build/k_a/k_a.fatbin", "k_a.cu"]
    cutlass = find_cutlass()
    assert f"-I{cutlass.root / 'include'}" in device
    assert rec["resources"]["registers"] > 0 and rec["resources"]["spill_bytes"] == 0
    assert set(rec["resources"]) >= {"registers", "shared_bytes", "spill_bytes", "stack_bytes"}
    assert "ptxas" in (out / "build" / "k_a" / "build.log").read_text()
    # the recorded command reproduces the artifact from the manifest directory
    (out / rec["artifacts"]["cubin"]).unlink()
    subprocess.run(device, cwd=out, check=True, capture_output=True)
    assert (out / rec["artifacts"]["cubin"]).is_file()


@needs_nvcc
def test_second_build_runs_no_nvcc(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b")})
    assert build(out).ok
    calls = env.calls()
    again = build(out)
    assert again.ok and [r.status for r in again.results] == ["cached", "cached"]
    assert env.calls() == calls
    assert {r["status"] for r in records(out).values()} == {"cached"}
    # a build directory wiped by hand is restored from the cache, still without nvcc
    shutil.rmtree(out / "build")
    third = build(out)
    assert [r.status for r in third.results] == ["cached", "cached"] and env.calls() == calls
    assert_intact(out, env.cache)


@needs_nvcc
def test_changing_one_instance_rebuilds_only_it(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b")})
    assert build(out).ok
    old_key = records(out)["k_b"]["cache_key"]
    calls = env.calls()
    (out / "k_b.cu").write_text(tiny_cu("k_b", body="p[threadIdx.x] = 2.0f;"))
    summary = build(out)
    assert {r.name: r.status for r in summary.results} == {"k_a": "cached", "k_b": "ok"}
    assert env.calls() == calls + 2
    assert records(out)["k_b"]["cache_key"] != old_key
    assert_intact(out, env.cache)


@needs_nvcc
def test_same_instance_in_another_directory_is_a_hit(tmp_path, env):
    a = write_manifest(tmp_path / "one", {"k_a": tiny_cu("k_a")})
    assert build(a).ok
    calls = env.calls()
    b = write_manifest(tmp_path / "elsewhere" / "two", {"k_a": tiny_cu("k_a")})
    summary = build(b)
    assert [r.status for r in summary.results] == ["cached"] and env.calls() == calls
    assert records(a)["k_a"]["cache_key"] == records(b)["k_a"]["cache_key"]
    assert_intact(b, env.cache)


@needs_nvcc
def test_no_cache_compiles_and_leaves_cache_alone(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a")})
    assert build(out).ok
    calls = env.calls()
    summary = build(out, options=BuildOptions(use_cache=False))
    assert [r.status for r in summary.results] == ["ok"] and env.calls() == calls + 2
    assert not any((out / "build" / ".tmp").glob("*"))


@needs_nvcc
def test_broken_instance_fails_alone(tmp_path, env):
    out = write_manifest(tmp_path / "out", {
        "k_a": tiny_cu("k_a"), "k_bad": tiny_cu("k_bad", body="this is not C++;"), "k_c": tiny_cu("k_c")})
    group = click.Group()
    register(group)
    res = CliRunner().invoke(group, ["build", str(out), "-j", "2"])
    assert res.exit_code == 1, res.output
    recs = records(out)
    assert recs["k_a"]["status"] == "ok" and recs["k_c"]["status"] == "ok"
    bad = recs["k_bad"]
    assert bad["status"] == "failed" and "error" in bad["error"] and "k_bad.cu" in bad["error"]
    assert bad["artifacts"] == {"cubin": None, "host": None}
    assert not (out / "build" / "k_bad" / "k_bad.fatbin").exists()
    assert "FAILED k_bad" in res.output and str(out / "k_bad.cu") in res.output
    assert "reproduce:" in res.output and f"cd {out} && " in res.output and "-o build/k_bad/k_bad.fatbin k_bad.cu" in res.output
    assert "1 failed" in res.output
    # fixed, it builds; the good ones stay cached
    (out / "k_bad.cu").write_text(tiny_cu("k_bad"))
    res = CliRunner().invoke(group, ["build", str(out)])
    assert res.exit_code == 0, res.output
    assert {k: r["status"] for k, r in records(out).items()} == {"k_a": "cached", "k_bad": "ok", "k_c": "cached"}


@needs_nvcc
def test_missing_source_and_unknown_arch_fail_alone(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_gone": tiny_cu("k_gone")})
    (out / "k_gone.cu").unlink()
    summary = build(out)
    st = {r.name: r.status for r in summary.results}
    assert st == {"k_a": "ok", "k_gone": "failed"}
    assert "cannot read the source" in summary.failed[0].error
    out2 = write_manifest(tmp_path / "out2", {"k_x": tiny_cu("k_x")}, arch="sm99")
    s2 = build(out2)
    assert [r.status for r in s2.results] == ["failed"] and "unknown arch" in s2.failed[0].error


@needs_nvcc
def test_selection_limits_what_is_built(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b"), "k_c": tiny_cu("k_c")},
                         configs={"k_a": {"tile": [128, 128, 32]}, "k_b": {"tile": [64, 64, 32]},
                                  "k_c": {"tile": [64, 64, 32]}})
    summary = build(out, select=["tile=64x64x32"], exclude=["k_c"])
    assert [r.name for r in summary.results] == ["k_b"] and summary.skipped == 2
    assert set(records(out)) == {"k_b"}


@needs_nvcc
def test_serialized_wgmma_fails_unless_allowed(tmp_path, env, monkeypatch):
    out = write_manifest(tmp_path / "out", {"k_w": tiny_cu("k_w")})
    monkeypatch.setenv("FAKE_PTXAS_LINE", C7510_LOG.splitlines()[0])
    summary = build(out)
    assert [r.status for r in summary.results] == ["failed"]
    rec = records(out)["k_w"]
    assert "C7510" in rec["error"] and "--allow-serialized-wgmma" in rec["error"]
    assert rec["artifacts"] == {"cubin": None, "host": None} and not (out / "build/k_w/k_w.fatbin").exists()
    calls = env.calls()
    # the compile was cached: allowing it needs no nvcc, and the warning stays in the record
    summary = build(out, options=BuildOptions(allow_serialized_wgmma=True))
    assert [r.status for r in summary.results] == ["cached"] and env.calls() == calls
    assert any("C7510" in w for w in records(out)["k_w"]["warnings"])
    # and without the flag the up-to-date shortcut does not let it through
    assert [r.status for r in build(out).results] == ["failed"]


@needs_nvcc
def test_cache_command_shows_and_clears(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a")})
    assert build(out).ok
    group = click.Group()
    register(group)
    res = CliRunner().invoke(group, ["cache"])
    assert res.exit_code == 0 and "entries: 1" in res.output and str(env.cache) in res.output
    res = CliRunner().invoke(group, ["cache", "--clear"])
    assert res.exit_code == 0 and "cleared 1 entries" in res.output
    assert Cache(env.cache).stats()["entries"] == 0
    calls = env.calls()
    shutil.rmtree(out / "build")
    assert [r.status for r in build(out).results] == ["ok"] and env.calls() == calls + 2


def _build_in_subprocess(out: Path, **popen) -> subprocess.Popen:
    code = ("import sys; from emitter.build import build; s = build(sys.argv[1]); "
            "sys.exit(0 if s.ok else 1)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", code, str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **popen)


@needs_nvcc
def test_concurrent_builds_on_overlapping_instances(tmp_path, env):
    shared = {"k_b": tiny_cu("k_b"), "k_c": tiny_cu("k_c")}
    one = write_manifest(tmp_path / "one", {"k_a": tiny_cu("k_a"), **shared})
    two = write_manifest(tmp_path / "two", {**shared, "k_d": tiny_cu("k_d")})
    procs = [_build_in_subprocess(one), _build_in_subprocess(two)]
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out in (one, two):
        assert {r["status"] for r in records(out).values()} <= {"ok", "cached"}
        assert_intact(out, env.cache)
    # the per-key lock: every distinct instance was compiled exactly once
    assert env.calls() == 4 * 2
    assert Cache(env.cache).stats()["entries"] == 4


@needs_nvcc
def test_sigkill_mid_build_leaves_nothing_half_written(tmp_path, env, monkeypatch):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b")})
    assert build(out).ok
    old = records(out)
    # change both; k_b's compile finishes its output, then stalls: the build is killed right there
    (out / "k_a.cu").write_text(tiny_cu("k_a", body="p[0] = 3.0f;"))
    (out / "k_b.cu").write_text(tiny_cu("k_b", body="p[1] = 3.0f;"))
    marker = tmp_path / "stalled"
    monkeypatch.setenv("SLOW_MARKER", str(marker))
    monkeypatch.setenv("SLOW_SOURCE", "k_b.cu")
    proc = _build_in_subprocess(out, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.time() < deadline, "the stalled compile never started"
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)       # the build and the nvcc processes it started
        proc.communicate()
    # whatever was left vouches only for matching artifacts; k_b still has its old, complete build
    assert_intact(out, env.cache)
    assert records(out)["k_b"]["cache_key"] == old["k_b"]["cache_key"]
    monkeypatch.delenv("SLOW_MARKER")
    summary = build(out)
    assert summary.ok
    new = records(out)
    assert new["k_b"]["cache_key"] != old["k_b"]["cache_key"] and new["k_a"]["cache_key"] != old["k_a"]["cache_key"]
    assert_intact(out, env.cache)
    # the dead build's work directories are gone
    assert not list((env.cache / "v1" / "tmp").glob("*"))


@needs_nvcc
def test_noop_rebuild_of_100_instances_is_under_a_second(tmp_path, env):
    # 100 names, one content: one compile, 99 cache hits; then the no-op rebuild is timed
    text = tiny_cu("k")
    out = write_manifest(tmp_path / "out", {f"k{i:03d}": text for i in range(100)})
    assert build(out).ok
    assert env.calls() == 2
    nvcc_mod.nvcc_version.cache_clear()
    nvcc_mod.host_compiler_version.cache_clear()
    t0 = time.perf_counter()
    summary = build(out)
    elapsed = time.perf_counter() - t0
    assert summary.ok and summary.count("cached") == 100 and env.calls() == 2
    assert elapsed < 1.0, f"no-op rebuild of 100 instances took {elapsed:.2f} s"


# ------------------------------------------------------------------------------------- pieces
def test_c7510_is_detected_in_a_ptxas_log():
    rep = ptxas.parse(C7510_LOG)
    assert rep.serialized_wgmma and "C7510" in rep.serialized_wgmma[0]
    res = rep.resources("poc_entry_g")
    assert res == {"registers": 168, "shared_bytes": 0, "spill_bytes": 64 + 280, "stack_bytes": 64}
    assert [f.name for f in rep.spilling] == ["poc_entry_g"]
    # the older "ptxas warning" spelling too
    assert ptxas.parse("ptxas warning : (C7510) Potential Performance Loss: wgmma.mma_async instructions are "
                       "serialized due to the presence of Extern calls in the function 'f'").serialized_wgmma
    clean = ptxas.parse(CLEAN_LOG)
    assert not clean.serialized_wgmma and not clean.warnings
    assert clean.resources("emitter_k_kernel") == {"registers": 168, "shared_bytes": 1024, "spill_bytes": 0,
                                                    "stack_bytes": 0}


def test_serialized_policy_and_spill_warnings():
    p = _Plan({}, Path("."), "k", "sm90a", "k.cu", nvcc_mod.Commands((), ()), "0" * 64)
    warnings, resources, error, serialized = _analyse(p, C7510_LOG, allow_serialized=False)
    assert error and "C7510" in error and resources["spill_bytes"] == 344 and serialized
    assert any(w.startswith("spills: poc_entry_g") for w in warnings)
    _, _, error, serialized = _analyse(p, C7510_LOG, allow_serialized=True)
    assert error is None and serialized
    _, _, error, serialized = _analyse(p, CLEAN_LOG, allow_serialized=False)
    assert error is None and not serialized


def _meminfo(gib: float) -> str:
    return f"MemTotal: 99999999 kB\nMemFree: 1 kB\nMemAvailable: {int(gib * 1024 * 1024)} kB\n"


def test_default_jobs_from_cores_and_memory():
    # the development machine: 2 cores, 24 GB: cores are the limit
    assert default_jobs({"sm90a"}, cpus=2, meminfo=_meminfo(24)) == 2
    # 16 cores, 24 GB free: (24 - 1) // 4 sm90a compiles, (24 - 1) // 2 sm80 ones
    assert default_jobs({"sm90a"}, cpus=16, meminfo=_meminfo(24)) == 5
    assert default_jobs({"sm80"}, cpus=16, meminfo=_meminfo(24)) == 11
    assert default_jobs({"sm80", "sm90a"}, cpus=16, meminfo=_meminfo(24)) == 5
    # little memory: never zero
    assert default_jobs({"sm90a"}, cpus=16, meminfo=_meminfo(2)) == 1
    assert default_jobs(set(), cpus=3, meminfo=_meminfo(64)) == 3
    assert mem_available(_meminfo(8)) == 8 << 30
    assert mem_available("garbage") is None
    assert default_jobs({"sm90a"}, cpus=4, meminfo="garbage") == 4


def test_cache_location_conventions(tmp_path):
    assert cache_root("/x/flag", {"EMITTER_CACHE_DIR": "/x/env"}) == Path("/x/flag")
    assert cache_root(None, {"EMITTER_CACHE_DIR": "/x/env", "XDG_CACHE_HOME": "/x/xdg"}) == Path("/x/env")
    assert cache_root(None, {"XDG_CACHE_HOME": "/x/xdg", "HOME": "/h"}) == Path("/x/xdg/emitter")
    assert cache_root(None, {"HOME": "/h"}) == Path("/h/.cache/emitter")


def test_cache_commit_is_all_or_nothing(tmp_path):
    cache = Cache(tmp_path / "c")
    key = "ab" * 32
    work = cache.new_work_dir()
    (work / "device.cubin").write_bytes(b"cubin")
    (work / "host.so").write_bytes(b"so")
    assert cache.lookup(key) is None
    entry = cache.commit(key, work, {"cubin": work / "device.cubin", "host": work / "host.so"}, {"name": "k"})
    assert cache.lookup(key).meta["files"]["cubin"]["size"] == 5
    # a second committer of the same key loses quietly; the first entry stands
    work2 = cache.new_work_dir()
    (work2 / "device.cubin").write_bytes(b"cubin")
    (work2 / "host.so").write_bytes(b"so")
    again = cache.commit(key, work2, {"cubin": work2 / "device.cubin", "host": work2 / "host.so"}, {"name": "k"})
    assert again.path == entry.path
    # a damaged entry is evicted, not handed out
    entry.file("cubin").write_bytes(b"CUBIN")
    assert cache.lookup(key) is None and not entry.path.exists()


def test_key_lock_excludes_a_second_holder(tmp_path):
    cache = Cache(tmp_path / "c")
    a, b = cache.lock("k" * 64), cache.lock("k" * 64)
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert b.try_acquire()
    b.release()


def test_cache_key_ignores_paths_but_not_content(tmp_path, monkeypatch):
    from emitter.build.builder import _Toolchain, cache_key

    tc = _Toolchain("/usr/bin/nvcc", "V13.0", "g++ 13", ["-I/a/include"], "x", "digest", ())
    moved = _Toolchain("/opt/cuda/bin/nvcc", "V13.0", "g++ 13", ["-I/b/include"], "x", "digest", ())
    assert cache_key(b"src", "sm80", tc) == cache_key(b"src", "sm80", moved)
    assert cache_key(b"src", "sm80", tc) != cache_key(b"src2", "sm80", tc)
    assert cache_key(b"src", "sm80", tc) != cache_key(b"src", "sm90a", tc)
    for other in (_Toolchain("/usr/bin/nvcc", "V13.1", "g++ 13", [], "x", "digest", ()),
                  _Toolchain("/usr/bin/nvcc", "V13.0", "g++ 14", [], "x", "digest", ()),
                  _Toolchain("/usr/bin/nvcc", "V13.0", "g++ 13", [], "x", "other", ()),
                  _Toolchain("/usr/bin/nvcc", "V13.0", "g++ 13", [], "x", "digest", ("-lineinfo",))):
        assert cache_key(b"src", "sm80", tc) != cache_key(b"src", "sm80", other)
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    before = cache_key(b"src", "sm80", tc)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-G")          # nvcc reads it: it changes what is built
    assert cache_key(b"src", "sm80", tc) != before


def test_gencode_per_arch():
    assert nvcc_mod.gencode("sm90a") == "-gencode=arch=compute_90a,code=sm_90a"
    for a in ("sm75", "sm80", "sm86", "sm89"):
        n = a[2:]
        assert nvcc_mod.gencode(a) == f"-gencode=arch=compute_{n},code=sm_{n}"
    with pytest.raises(nvcc_mod.UnknownArch):
        nvcc_mod.gencode("sm99")


def test_cutlass_path(tmp_path, monkeypatch):
    good = tmp_path / "cutlass"
    (good / "include" / "cutlass").mkdir(parents=True)
    (good / "include" / "cutlass" / "cutlass.h").write_text("")
    (good / "tools" / "util" / "include").mkdir(parents=True)
    h = find_cutlass({"CUTLASS_PATH": str(good)})
    assert h.root == good.resolve() and h.origin == "CUTLASS_PATH"
    assert h.include_flags() == [f"-I{good.resolve()}/include", f"-I{good.resolve()}/tools/util/include"]
    with pytest.raises(CutlassNotFound, match="CUTLASS_PATH"):
        find_cutlass({"CUTLASS_PATH": str(tmp_path / "nope")})
    pkg = find_cutlass({})
    assert (pkg.root / "include" / "cutlass" / "cutlass.h").is_file() and pkg.origin.startswith("nvidia-cutlass")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CutlassNotFound) as e:
        find_cutlass({})
    assert "pip install nvidia-cutlass" in e.value.render() and "CUTLASS_PATH" in e.value.render()


def test_cutlass_is_located_without_importing_it():
    code = ("import sys; from emitter.cutlass_path import find_cutlass, headers_digest; h = find_cutlass({}); "
            "headers_digest(h); print('cutlass_library' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------- a real emitted manifest
def _real_manifests() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "generated").glob("*/manifest.json"))


@pytest.mark.nvcc
@pytest.mark.skipif(not _real_manifests(), reason="no emitted manifest under generated/ (run `make emit`)")
def test_real_emitted_instances_build(tmp_path, monkeypatch):
    """One instance per arch of an emitted manifest, copied out of the tree and built for real."""
    monkeypatch.setenv("EMITTER_CACHE_DIR", str(tmp_path / "cache"))
    src = _real_manifests()[0]
    data = json.loads((src / "manifest.json").read_text())
    picked, seen = [], set()
    for inst in data["instances"]:
        if inst["arch"] not in seen:
            seen.add(inst["arch"])
            picked.append(inst)
    out = tmp_path / "out"
    out.mkdir()
    for inst in picked:
        shutil.copy(src / inst["source"], out / inst["source"])
    (out / "manifest.json").write_text(json.dumps(dict(data, instances=picked)))
    summary = build(out)
    assert summary.ok, [(r.name, r.error) for r in summary.failed]
    for r in summary.results:
        rec = r.record
        assert rec["resources"]["registers"] > 0, rec
        assert not rec.get("serialized_wgmma"), rec["warnings"]


def test_unwritable_cache_is_a_clean_error(tmp_path):
    from emitter.build.cache import CacheError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="--no-cache"):
        Cache(blocker / "cache").ensure_writable()


def test_host_syntax_only_changes_the_host_command_and_the_key():
    from emitter.build.builder import _Toolchain, cache_key

    plain = nvcc_mod.commands("nvcc", "sm80", [])
    fast = nvcc_mod.commands("nvcc", "sm80", [], host_syntax_only=True)
    assert "-fdevice-syntax-only" in fast.host and "-fdevice-syntax-only" not in plain.host
    assert fast.device == plain.device
    tc = _Toolchain("nvcc", "V13.0", "g++", [], "x", "d", ())
    tc_fast = _Toolchain("nvcc", "V13.0", "g++", [], "x", "d", (), True)
    assert cache_key(b"s", "sm80", tc) != cache_key(b"s", "sm80", tc_fast)


@needs_nvcc
def test_process_executor_and_progress_bar(tmp_path, env):
    out = write_manifest(tmp_path / "out", {"k_a": tiny_cu("k_a"), "k_b": tiny_cu("k_b")})
    group = click.Group()
    register(group)
    res = CliRunner().invoke(group, ["build", str(out), "--executor", "process", "--progress", "-j", "2"])
    assert res.exit_code == 0, res.output
    assert {r["status"] for r in records(out).values()} == {"ok"}
    assert "built 2 instances: 2 compiled, 0 cached, 0 failed" in res.output


def test_cache_key_ignores_the_spec_path_in_the_banner(tmp_path):
    """The banner names the spec file as given (an absolute path differs between checkouts; the benchmark passes
    absolute paths): the same instance emitted from two checkouts must share its cache entry."""
    from emitter.build.builder import _Toolchain, cache_key
    from emitter.emit import emit

    tc = _Toolchain("/usr/bin/nvcc", "V13.0", "g++ 13", [], "x", "digest", ())
    spec = "defaults: {arch: sm90a, dtype: bf16, layout: tn}\nkernels:\n  - {tile: 128x128x64, cluster: 2x1x1}\n"
    keys, banners = [], []
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        (tmp_path / checkout / "spec.yaml").write_text(spec)
        res = emit([tmp_path / checkout / "spec.yaml"], tmp_path / checkout / "gen", jobs=1)
        src = (tmp_path / checkout / "gen" / f"{res.instances[0].name}.cu").read_bytes()
        banners.append(next(line for line in src.splitlines() if line.startswith(b"// generated by emitter")))
        keys.append(cache_key(src, "sm90a", tc))
    assert banners[0] != banners[1]            # the paths differ in the source ...
    assert keys[0] == keys[1]                  # ... but not in the key
    code_changed = src.replace(b"cutlass::gemm::GemmUniversalMode", b"cutlass::gemm::GemmUniversalMode ", 1)
    assert code_changed != src and cache_key(code_changed, "sm90a", tc) != keys[1]
