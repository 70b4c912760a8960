"""The exported library's C API refuses batch strides that make D's matrices overlap (issue 25 must-have 6):
api.cpp compiled with g++ against a stand-in CUDA runtime and fake shims (as tests/gemm/test_gemm_library.py does),
checked against a brute-force count of D's addresses on random and hand-picked layouts."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from library_helpers import _FAKE_CUDA, _FAKE_KERNELS, SPEC, _compile  # noqa: E402

_MAIN = r"""
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include "ovl/ovl.h"
int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    long long layout, m, n, batch, ldd, bsd;
    in >> layout >> m >> n >> batch >> ldd >> bsd;
    ovl_gemm_problem p;
    ovl_gemm_problem_init(&p);
    p.m = int(m); p.n = int(n); p.k = 64; p.batch_count = int(batch);
    p.a_type = p.b_type = p.c_type = p.d_type = 2;
    p.a_layout = 1; p.b_layout = 2; p.c_layout = int(layout);
    p.ldd = ldd; p.batch_stride_d = bsd;
    p.A = reinterpret_cast<void*>(0x100000); p.B = p.A; p.D = reinterpret_cast<void*>(0x200000);
    const int s = ovl_gemm(&p, nullptr, 0, nullptr);
    std::printf("%d %d\n", s, std::strstr(ovl_last_error(), "overlap") != nullptr ? 1 : 0);
  }
  return 0;
}
"""


def _overlaps(layout: int, m: int, n: int, batch: int, ldd: int, bsd: int) -> bool:
    row = layout == 1
    ld = ldd or (n if row else m)
    bs = bsd or ld * (m if row else n)
    seen = set()
    for b in range(batch):
        for i in range(m):
            for j in range(n):
                o = b * bs + (i * ld + j if row else i + j * ld)
                if o in seen:
                    return True
                seen.add(o)
    return False


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_c_api_refuses_overlapping_d_batches(tmp_path):
    from emitter.emit import emit
    from emitter.library.export import export_library

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    emit([spec], tmp_path / "gen", jobs=1)
    r = export_library([tmp_path / "gen"], "ovl", tmp_path / "lib")
    out = tmp_path / "lib"
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib="ovl", rows=rows))
    (fake / "main.cpp").write_text(_MAIN)
    exe = tmp_path / "api"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / "src/ovl_api.cpp"), str(out / "src/ovl_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "main.cpp"), "-o", str(exe)])
    rnd = random.Random(25)
    cases = [
        (1, 8, 6, 3, 0, 0), (2, 8, 6, 3, 0, 0),        # packed: fine
        (1, 8, 6, 3, 6, 6 * 8), (1, 8, 6, 3, 10, 80),  # packed / padded
        (1, 8, 6, 2, 12, 6),                           # interleaved rows (a permuted (m, batch, n) tensor): fine
        (1, 8, 6, 3, 6, 6), (1, 8, 6, 3, 0, 1),        # overlapping
        (2, 8, 6, 4, 8, 8 * 5), (1, 8, 6, 2, 0, 47),   # overlapping: one column / element short
        (1, 8, 6, 2, 6, 48), (1, 1, 1, 5, 0, 1),       # just clear; 1x1 matrices one element apart
        (1, 8, 6, 2, 2 ** 62, 0), (1, 8, 6, 2, 2 ** 62, 5),   # ld * m past int64 (no overflow); then 5 apart
    ]
    for _ in range(800):
        layout, m, n, batch = rnd.choice((1, 2)), rnd.randint(1, 6), rnd.randint(1, 6), rnd.randint(2, 4)
        lines = n if layout == 1 else m
        ldd = rnd.choice((0, lines, lines + rnd.randint(0, 6)))
        bsd = rnd.choice((0, rnd.randint(1, 20), rnd.randint(1, 80), (ldd or lines) * (m if layout == 1 else n)))
        cases.append((layout, m, n, batch, ldd, bsd))
    res = subprocess.run([str(exe)], input="\n".join(" ".join(map(str, c)) for c in cases) + "\n",
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(res) == len(cases)
    refused = accepted = conservative = 0
    for case, line in zip(cases, res):
        status, says_overlap = map(int, line.split())
        if _overlaps(*case):
            assert (status, says_overlap) == (2, 1), (case, line)   # INVALID_ARGUMENT, naming the overlap
            refused += 1
        elif says_overlap:
            conservative += 1   # disjoint but not a sorted-stride layout (e.g. batches tiling each other's gaps)
        else:
            accepted += 1
    for case, line in zip(cases[:5] + cases[9:11], res[:5] + res[9:11]):
        assert line.split()[1] == "0", (case, line)   # every dense layout passes the overlap check
    print("overlap cases", refused, accepted, conservative)
    assert refused > 100 and accepted > 100 and conservative < refused // 4, (refused, accepted, conservative)


# ---- the family plug: a toy family's library pieces reach every slot ------------------------------------

def test_family_library_pieces_plug(tmp_path, monkeypatch):
    import json
    import types

    from emitter.emit import emit
    from emitter.families import registry
    from emitter.kit.library import LibraryError, LibraryPieces
    from emitter.library.export import export_library

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    emit([spec], tmp_path / "gen", jobs=1)
    manifest = json.loads((tmp_path / "gen" / "manifest.json").read_text())
    toy = dict(manifest["instances"][1], name="toy_k1", family="toy", source="toy_k1.cu", config={"x": 1})
    manifest["instances"].append(toy)
    (tmp_path / "gen" / "toy_k1.cu").write_text("// toy\n")
    (tmp_path / "gen" / "manifest.json").write_text(json.dumps(manifest))
    seen = {}

    def library_pieces(entries, roots, ctx):
        seen["entries"] = [e["name"] for e in entries]
        lib = ctx["lib"]
        return LibraryPieces(
            family="toy",
            header=(f"typedef struct {lib}_toy_problem {{ uint32_t struct_size; }} {lib}_toy_problem;\n"
                    f"{ctx['LIB']}_API {lib}_status {lib}_toy(const {lib}_toy_problem* p);\n",),
            api=(f'extern "C" {lib}_status {lib}_toy(const {lib}_toy_problem* p) {{ return p ? succeed() : '
                 f'fail({ctx["LIB"]}_STATUS_INVALID_ARGUMENT, "toy: NULL"); }}\n',),
            table=("// toy kernel table: 1 row\n",),
            python=("def toy() -> int:\n    return 42\n",),
            c_functions=(("toy", "ctypes.c_int", ("ctypes.c_void_p",)),),
            python_names=("toy",),
            files={"src/toy/toy_k1.launch.cu": "// toy translation unit\n"},
            sources=(("src/toy/toy_k1.launch.cu", "sm90a"),),
            kernels=1)

    module = types.ModuleType("toy_family_for_tests")
    monkeypatch.setitem(sys.modules, "toy_family_for_tests", module)
    monkeypatch.setitem(registry.FAMILIES, "toy", "toy_family_for_tests")
    with pytest.raises(LibraryError, match="provides no library pieces.*--exclude 'family=toy'"):
        export_library([tmp_path / "gen"], "plug", tmp_path / "lib0")
    module.library_pieces = library_pieces
    r = export_library([tmp_path / "gen"], "plug", tmp_path / "lib")
    out = tmp_path / "lib"
    assert seen["entries"] == ["toy_k1"] and len(r.kernels) == 2   # GEMM kernels stay GEMM's
    assert "plug_toy(const plug_toy_problem* p);" in (out / "include/plug/plug.h").read_text()
    assert 'extern "C" plug_status plug_toy' in (out / "src/plug_api.cpp").read_text()
    assert "// toy kernel table" in (out / "src/plug_table.cpp").read_text()
    assert "    plug_toy;" in (out / "src/plug.map").read_text()
    cmake = (out / "CMakeLists.txt").read_text()
    assert "  src/toy/toy_k1.launch.cu\n" in cmake.split("set(_plug_sources_sm90a")[1].split(")")[0]
    assert (out / "src/toy/toy_k1.launch.cu").read_text() == "// toy translation unit\n"
    assert "src/toy/toy_k1.launch.cu" in json.loads((out / "manifest.json").read_text())["files"]
    loader = (out / "python/plug.py").read_text()
    assert '"toy"]' in loader and '"toy": (ctypes.c_int, [ctypes.c_void_p]),' in loader
    ns: dict = {"__name__": "plug_for_test"}
    monkeypatch.setitem(sys.modules, "plug_for_test", types.ModuleType("plug_for_test"))
    exec(compile(loader, str(out / "python/plug.py"), "exec"), ns)
    assert ns["toy"]() == 42 and "toy" in ns["__all__"]
    # the C++ compiles (host only): header + api with the toy piece
    if shutil.which("g++") or shutil.which("c++"):
        fake = tmp_path / "fake"
        fake.mkdir()
        (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
        _compile(["-c", f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
                  str(out / "src/plug_api.cpp"), "-o", str(tmp_path / "api.o")])


def test_tuning_tables_not_measured_on_a_gpu_are_refused_unless_forced(tmp_path):
    import json

    from click.testing import CliRunner

    from emitter.cli import main as cli
    from emitter.emit import emit
    from emitter.library.export import export_library
    from emitter.kit.tuning import TuningError
    from library_helpers import SM90A

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    emit([spec], tmp_path / "gen", jobs=1)
    entry = {"problem": {"m": 256, "n": 256, "k": 256, "batch": 1}, "kernel": SM90A, "median_ms": 0.01}
    tables = {
        "fake": {"gpu": {"name": "fake GPU (numpy backend)", "sm_count": 132, "cc": "9.0"}},
        "backend": {"backend": "fake", "gpu": {"cc": "9.0"}},
        "real": {"gpu": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "cc": "9.0"}},
    }
    paths = {}
    for label, extra in tables.items():
        paths[label] = tmp_path / f"{label}.json"
        paths[label].write_text(json.dumps({"schema_version": 1, "kind": "emitter.tuning_table", **extra,
                                            "entries": [entry]}))
    for label in ("fake", "backend"):
        with pytest.raises(TuningError, match="not measured on a real GPU.*--allow-unmeasured-tuning"):
            export_library([tmp_path / "gen"], "tt", tmp_path / "out", tuning=[paths[label]])
        r = export_library([tmp_path / "gen"], "tt", tmp_path / "out", tuning=[paths[label]],
                           allow_unmeasured_tuning=True)
        assert len(r.tuning) == 1
    assert len(export_library([tmp_path / "gen"], "tt", tmp_path / "out", tuning=[paths["real"]]).tuning) == 1
    args = ["library", str(tmp_path / "gen"), "--name", "tt", "-o", str(tmp_path / "cli"), "--tuning", str(paths["fake"])]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "not measured on a real GPU" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, args + ["--allow-unmeasured-tuning"])
    assert res.exit_code == 0 and "1 tuned shapes" in res.output, res.output
