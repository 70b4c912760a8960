"""`emitter library` as a stage, on the two-kernel GEMM library: the exported tree and its manifest,
deterministic and incremental export, export errors, the CLI, and (nvcc) a CMake build + install + consumer
link. GEMM's own library behaviour (dispatch, tuning records, C API, loader) is in tests/gemm/test_gemm_library.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.cli import main as cli
from emitter.library.export import LibraryError, export_library

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_helpers import SM80, SM90A, _tuning, manifest_dir, tuning_file  # noqa: E402,F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]


# ---- export ---------------------------------------------------------------------------------------

def test_export_tree_manifest_and_dispatch_data(manifest_dir, tuning_file, tmp_path):
    out = tmp_path / "mykernels"
    r = export_library([manifest_dir], "mykernels", out, tuning=[tuning_file])
    for rel in ("CMakeLists.txt", "cmake/mykernelsConfig.cmake.in", "include/mykernels/mykernels.h",
                "src/mykernels_api.cpp", "src/mykernels_dispatch.h", "src/mykernels_table.cpp", "src/mykernels_kernels.cpp",
                "src/mykernels_kernels.h", "src/mykernels.map", "src/emitter_abi.h", "tools/mykernels_dispatch_probe.cpp",
                "python/mykernels.py", "README.md", "manifest.json", f"src/instances/{SM80}.cu", f"src/instances/{SM80}.launch.cu",
                f"src/instances/{SM90A}.cu", f"src/instances/{SM90A}.launch.cu"):
        assert (out / rel).is_file(), rel
    # the instance sources are copied byte for byte
    assert (out / f"src/instances/{SM90A}.cu").read_bytes() == (manifest_dir / f"{SM90A}.cu").read_bytes()
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "emitter.library" and m["name"] == "mykernels"
    assert [k["name"] for k in m["kernels"]] == sorted([SM80, SM90A])
    assert sorted((t["kernel"], t["problem"]["m"]) for t in m["tuning"]) == sorted([(SM90A, 4096), (SM90A, 128), (SM80, 1024)])
    assert [d["kernel"] for d in m["left_out"]["tuning_entries"]] == ["gemm_not_in_this_manifest"]
    assert set(m["archs"]) == {"sm80", "sm90a"}
    assert len(r.tuning) == 3
    # dispatch data in the table source; the launcher keeps the instance's cluster shape and passes Params by value
    table = (out / "src/mykernels_table.cpp").read_text()
    assert "const int kTuningCount = 3;" in table and f'"{SM90A}"' in table
    launch = (out / f"src/instances/{SM90A}.launch.cu").read_text()
    assert "__cluster_dims__(1, 1, 1)" in launch and "__grid_constant__ Params const params" in launch
    assert f"#define emitter_{SM90A}_query mykernels_k_{SM90A}_query" in launch
    cmake = (out / "CMakeLists.txt").read_text()
    assert "project(mykernels VERSION 1.0.0 LANGUAGES CXX CUDA)" in cmake
    assert 'set(_mykernels_default_sm90a "90a")' in cmake and 'set(_mykernels_default_sm80 "80")' in cmake
    assert "install(EXPORT mykernelsTargets" in cmake


def test_export_is_deterministic_and_incremental(manifest_dir, tuning_file, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    export_library([manifest_dir], "mykernels", a, tuning=[tuning_file])
    export_library([manifest_dir], "mykernels", b, tuning=[tuning_file])
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    again = export_library([manifest_dir], "mykernels", a, tuning=[tuning_file])
    assert again.written == []
    # a new tuning table rewrites only the dispatch data: an incremental build recompiles one small file
    t2 = _tuning([(SM90A, 2048, 2048, 2048)], tmp_path / "t2.json")
    r = export_library([manifest_dir], "mykernels", a, tuning=[t2])
    assert r.written == ["src/mykernels_table.cpp"]
    # dropping a kernel removes its files
    r = export_library([manifest_dir], "mykernels", a, tuning=[t2], archs=["sm90a"])
    assert sorted(r.removed) == sorted([f"src/instances/{SM80}.cu", f"src/instances/{SM80}.launch.cu"])
    assert not (a / f"src/instances/{SM80}.cu").exists()
    assert "sm80" not in (a / "CMakeLists.txt").read_text().split("KERNEL_ARCHS", 1)[1].splitlines()[0]


def test_export_errors(manifest_dir, tmp_path):
    with pytest.raises(LibraryError, match="not usable"):
        export_library([manifest_dir], "My-Lib", tmp_path / "x")
    with pytest.raises(LibraryError, match="not usable"):
        export_library([manifest_dir], "cuda", tmp_path / "x")
    with pytest.raises(LibraryError, match="no instance to export"):
        export_library([manifest_dir], "mykernels", tmp_path / "x", select=["tile=999x999x999"])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(LibraryError, match="not an exported library"):
        export_library([manifest_dir], "mykernels", tmp_path / "busy")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 7, "entries": []}))
    from emitter.kit.tuning import TuningError
    with pytest.raises(TuningError, match="schema_version 7"):
        export_library([manifest_dir], "mykernels", tmp_path / "y", tuning=[bad])
    bad.write_text(json.dumps({"schema_version": 1, "entries": [{"kernel": SM80, "problem": {"m": 0, "n": 1, "k": 1}}]}))
    with pytest.raises(TuningError, match="positive integer"):
        export_library([manifest_dir], "mykernels", tmp_path / "z", tuning=[bad])


def test_cli_library(manifest_dir, tuning_file, tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(cli, ["library", str(manifest_dir), "--tuning", str(tuning_file), "--name", "mykernels",
                                   "-o", str(out), "--select", "arch=sm80"])
    assert res.exit_code == 0, res.output
    assert "library mykernels: 1 kernels (1 sm80), 1 tuned shapes" in res.output
    assert "gemm_not_in_this_manifest" in res.output
    res = CliRunner().invoke(cli, ["library", str(manifest_dir), "--name", "bad name", "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "not usable" in res.output and "Traceback" not in res.output


# ---- CMake + nvcc: build, install, link a consumer (no GPU needed) ---------------------------------

def _run(cmd: list[str], cwd: Path | None = None, lock: bool = False) -> str:
    """Runs a command; heavy compiles go through `flock $EMITTER_NVCC_LOCK` when that is set (shared machines)."""
    if lock and os.environ.get("EMITTER_NVCC_LOCK") and shutil.which("flock"):
        cmd = ["flock", os.environ["EMITTER_NVCC_LOCK"], *cmd]
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-6000:]}\n{res.stderr[-6000:]}"
    return res.stdout + res.stderr


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_cmake_build_install_and_consumer_link(manifest_dir, tuning_file, tmp_path):
    src = tmp_path / "mykernels"
    export_library([manifest_dir], "mykernels", src, tuning=[tuning_file])
    jobs = os.environ.get("EMITTER_TEST_JOBS", "2")
    # shared, both archs (sm80 -> 80, sm90a -> 90a)
    build, prefix = tmp_path / "build", tmp_path / "prefix"
    out = _run(["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_INSTALL_PREFIX={prefix}"])
    assert "1 sm80 kernel(s) for CUDA architectures 80" in out and "1 sm90a kernel(s) for CUDA architectures 90a" in out
    # configuring again (any cmake re-run) keeps the default: the cache must not turn it into a "choice"
    again = _run(["cmake", "-S", str(src), "-B", str(build)])
    assert "1 sm80 kernel(s) for CUDA architectures 80" in again and "1 sm90a kernel(s) for CUDA architectures 90a" in again
    _run(["cmake", "--build", str(build), "-j", jobs], lock=True)
    _run(["cmake", "--install", str(build)])
    lib = prefix / "lib" / "libmykernels.so"
    assert lib.exists() and (prefix / "include/mykernels/mykernels.h").exists()
    assert (prefix / "lib/cmake/mykernels/mykernelsConfig.cmake").exists()
    assert (prefix / "lib/mykernels/python/mykernels.py").exists() and (prefix / "share/mykernels/manifest.json").exists()
    # the shared library exports the C API and nothing else
    if shutil.which("nm"):
        syms = {l.split()[-1] for l in _run(["nm", "-D", "--defined-only", str(lib)]).splitlines() if l.strip()}
        from emitter.families.gemm.library import C_FUNCTIONS
        from emitter.library.export import SHARED_FUNCTIONS

        assert syms == {f"mykernels_{f}" for f in SHARED_FUNCTIONS + C_FUNCTIONS}
    # the consumer: find_package + link, then run it up to the point that needs a GPU
    cbuild = tmp_path / "consumer"
    _run(["cmake", "-S", str(ROOT / "examples/library_consumer"), "-B", str(cbuild), f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run(["cmake", "--build", str(cbuild)])
    listing = subprocess.run([str(cbuild / "consumer"), "--list"], capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    assert "mykernels 1 (emitter" in listing.stdout and SM80 in listing.stdout and SM90A in listing.stdout
    # the Python loader finds the installed library next to itself and reads the kernel table
    py = subprocess.run([sys.executable, "-c", "import mykernels; ks = mykernels.kernels(); "
                         "print(mykernels.version()); print(len(ks), sorted(k['name'] for k in ks)[0], ks[0]['available'])"],
                        env={**os.environ, "PYTHONPATH": str(prefix / "lib/mykernels/python")}, capture_output=True, text=True)
    assert py.returncode == 0, py.stderr
    assert f"2 {SM80} 1" in py.stdout and "3 tuned shapes" in py.stdout

    # static, sm80 kernels only: CMAKE_CUDA_ARCHITECTURES leaves the sm90a kernel out (it stays in the table, unavailable)
    build2, prefix2 = tmp_path / "build-static", tmp_path / "prefix-static"
    out = _run(["cmake", "-S", str(src), "-B", str(build2), f"-DCMAKE_INSTALL_PREFIX={prefix2}", "-DBUILD_SHARED_LIBS=OFF",
                "-DCMAKE_CUDA_ARCHITECTURES=80"])
    assert "leaving out 1 sm90a kernel(s)" in out and "static" in out
    _run(["cmake", "--build", str(build2), "-j", jobs], lock=True)
    _run(["cmake", "--install", str(build2)])
    assert (prefix2 / "lib/libmykernels.a").exists()
    cbuild2 = tmp_path / "consumer-static"
    _run(["cmake", "-S", str(ROOT / "examples/library_consumer"), "-B", str(cbuild2), f"-DCMAKE_PREFIX_PATH={prefix2}"])
    _run(["cmake", "--build", str(cbuild2)])
    listing = subprocess.run([str(cbuild2 / "consumer"), "--list"], capture_output=True, text=True)
    assert listing.returncode == 0 and "not-built " + SM90A in listing.stdout and "no-arch " + SM80 in listing.stdout

    # an architecture list no kernel can use is a clear configure error
    bad = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "build-bad"), "-DCMAKE_CUDA_ARCHITECTURES=75"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "builds none of this library's kernels" in " ".join(bad.stderr.split())
