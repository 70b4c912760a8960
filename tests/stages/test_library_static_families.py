"""A static build (BUILD_SHARED_LIBS=OFF) of a library with attention and conv kernels links the family kernels
into a consumer without --whole-archive, and CMake's status lines count GEMM kernels and family translation
units apart (templates/library/CMakeLists.txt.j2).

The API reaches the family kernels' entry points through weak references (NULL where CMake left an arch out),
and a weak reference pulls no member out of an archive: before the fix a consumer of lib<lib>.a got NULL for
every attention and conv kernel. The kernels' translation units are replaced by stand-ins that define the same
entry points (nvcc compiles them in seconds; no CUTLASS kernel is built), so what is checked is the linking."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_attention_library import GEMM_SPEC  # noqa: E402
from test_library import _run  # noqa: E402

LIB = "stfam"
SPEC = GEMM_SPEC.split("  - arch: sm90a")[0] + """\
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: none
    lse: true
    gqa: true
"""
from tests._helpers import nvcc_path  # noqa: E402

CONV = ROOT / "configs/conv/sm80_resnet50.yaml"

needs_tools = pytest.mark.skipif(shutil.which("cmake") is None or nvcc_path() is None or
                                 shutil.which("nm") is None or shutil.which("g++") is None,
                                 reason="needs cmake, nvcc, nm and g++")


def _entry_points(src: Path) -> dict[str, list[str]]:
    """kernel name -> the C entry points the API and kernels.cpp reference (<lib>_<tag>_<name>_query/_run)."""
    text = (src / f"src/{LIB}_api.cpp").read_text() + (src / f"src/{LIB}_kernels.cpp").read_text()
    out: dict[str, list[str]] = {}
    for sym, name in re.findall(rf"\b({LIB}_[a-z]+_(\w+?)_(?:query|run))\(", text):
        out.setdefault(name, [])
        if sym not in out[name]:
            out[name].append(sym)
    return out


def _stand_ins(src: Path) -> list[str]:
    """Replaces every kernel translation unit with one defining the kernel's entry points (in its .launch.cu);
    returns the family (non-GEMM) entry points."""
    entries = _entry_points(src)
    family = []
    listed = re.findall(r"^\s+(src/\S+\.cu)$", (src / "CMakeLists.txt").read_text(), re.M)
    assert listed
    for rel in listed:
        name = Path(rel).name.split(".")[0]
        body = "// stand-in for the test: entry points only\n"
        if rel.endswith(".launch.cu"):
            assert name in entries, (rel, sorted(entries))
            for sym in entries[name]:
                body += f'extern "C" int {sym}(const void*, void*, void*, int*) {{ return 7; }}\n'
                if not rel.startswith("src/instances/"):
                    family.append(sym)
        (src / rel).write_text(body)
    return family


def test_summaries_count_each_family(tmp_path):
    """`emitter library` names each family's kernels; a GEMM-only tree's CMakeLists.txt has none of the family
    machinery (it renders only when a family adds sources)."""
    from click.testing import CliRunner

    from emitter.cli import main

    (tmp_path / "spec.yaml").write_text(SPEC)
    r = CliRunner().invoke(main, ["emit", str(tmp_path / "spec.yaml"), str(CONV), "-o", str(tmp_path / "gen"), "-q"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["library", str(tmp_path / "gen"), "--name", LIB, "-o", str(tmp_path / "lib")])
    assert r.exit_code == 0, r.output
    assert f"library {LIB}: 1 GEMM kernels (1 sm80), 1 attention kernels, 7 conv kernels, 0 tuned shapes" in r.output
    cmake = (tmp_path / "lib" / "CMakeLists.txt").read_text()
    assert "of 1 GEMM kernels" in cmake and "translation units of 1 attention, 7 conv kernels" in cmake
    r = CliRunner().invoke(main, ["library", str(tmp_path / "gen"), "--name", "gonly", "-o", str(tmp_path / "g"),
                                  "--exclude", "family=attention", "--exclude", "family=conv"])
    assert r.exit_code == 0, r.output
    assert "library gonly: 1 kernels (1 sm80), 0 tuned shapes" in r.output
    cmake = (tmp_path / "g" / "CMakeLists.txt").read_text()
    assert "family" not in cmake and "of 1 kernels, ${CMAKE_BUILD_TYPE}" in cmake


@pytest.mark.nvcc
@needs_tools
def test_static_library_links_family_kernels_without_whole_archive(tmp_path):
    from emitter.emit import emit
    from emitter.library.export import export_library

    (tmp_path / "spec.yaml").write_text(SPEC)
    emit([tmp_path / "spec.yaml", CONV], tmp_path / "gen", jobs=1)
    src = tmp_path / LIB
    export_library([tmp_path / "gen"], LIB, src)
    family = _stand_ins(src)
    assert any(f"{LIB}_a_" in s for s in family) and any(f"{LIB}_ck_" in s for s in family)
    build = tmp_path / "build"
    out = _run(["cmake", "-S", str(src), "-B", str(build), "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_CUDA_ARCHITECTURES=80"])
    # 1 GEMM kernel; 1 attention kernel (shim + launch) and 7 conv kernels (launch): 9 translation units
    assert "1 sm80 kernel(s) (with 9 translation unit(s) of attention/conv kernels) for CUDA architectures 80" in out
    assert "1 of 1 GEMM kernels, 9 of 9 translation units of 1 attention, 7 conv kernels" in out and "static" in out
    _run(["cmake", "--build", str(build), "-j", os.environ.get("EMITTER_TEST_JOBS", "2")], lock=True)
    archive = build / f"lib{LIB}.a"
    assert archive.exists()
    # a consumer that calls one C API function and links the archive plainly (no --whole-archive)
    (tmp_path / "main.c").write_text(f'#include <stdio.h>\n#include "{LIB}/{LIB}.h"\n'
                                     f'int main(void) {{ puts({LIB}_version()); return 0; }}\n')
    cudart = re.search(r"^CUDA_cudart_static_LIBRARY:\w+=(.+)$", (build / "CMakeCache.txt").read_text(), re.M)
    assert cudart, "CMake found no static CUDA runtime"
    exe = tmp_path / "consumer"
    _run(["g++", "-x", "c", str(tmp_path / "main.c"), "-x", "none", f"-I{src / 'include'}", str(archive),
          cudart.group(1).strip(), "-ldl", "-lpthread", "-lrt", "-o", str(exe)])
    defined = {line.split()[-1] for line in _run(["nm", "--defined-only", str(exe)]).splitlines() if line.strip()}
    missing = [s for s in family if s not in defined]
    assert not missing, f"{len(missing)} of {len(family)} family entry points not linked: {missing[:4]}"
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0 and LIB in res.stdout, res.stderr
