"""`emitter library`: export, dispatch data, the Python mirror of the C++ selection (and that the two agree),
the C struct layout the Python loader relies on, and (nvcc) a CMake build + install + consumer link."""

from __future__ import annotations

import ctypes
import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emitter.cli import main as cli
from emitter.library import abi
from emitter.library.dispatch import (ACTIVATIONS, DTYPES, LAYOUTS, KernelRecord, Op, Query, TuningRecord,
                                      candidate_order, dispatch_order, kernel_records, log2_fixed, select,
                                      transpose, tuning_records)
from emitter.library.export import LibraryError, export_library

ROOT = Path(__file__).resolve().parent.parent
SM80 = "gemm_sm80_f16f16_f16f16_accf32_tnt_64x64x64_w32x32x64_i16x8x16_s3_swz8_al8x8x8_identity"
SM90A = "gemm_sm90a_bf16bf16_bf16bf16_accf32_tnt_64x128x64_c1x1x1_i64x128x16_sauto_pingpong_epitma_persistent_al8x8x8_identity"

SPEC = """\
kernels:
  - arch: sm80
    dtype: {a: f16, b: f16, c: f16, d: f16, accumulator: f32}
    layout: tn
    tile: 64x64x64
    warp: 32x32x64
    stages: 3
    swizzle: 8
  - arch: sm90a
    dtype: {a: bf16, b: bf16, c: bf16, d: bf16, accumulator: f32}
    layout: tn
    tile: 64x128x64
    cluster: 1x1x1
    stages: auto
    schedule: {kernel: pingpong}
"""


def _tuning(entries: list[tuple[str, int, int, int]], path: Path) -> Path:
    path.write_text(json.dumps({"schema_version": 1, "kind": "emitter.tuning_table", "entries": [
        {"problem": {"m": m, "n": n, "k": k, "batch": 1}, "kernel": name, "median_ms": 0.1} for name, m, n, k in entries]}))
    return path


@pytest.fixture(scope="module")
def manifest_dir(tmp_path_factory) -> Path:
    from emitter.emit import emit

    d = tmp_path_factory.mktemp("lib")
    spec = d / "tiny.yaml"
    spec.write_text(SPEC)
    r = emit([spec], d / "gen", jobs=1)
    assert sorted(i.name for i in r.instances) == sorted([SM80, SM90A])
    return d / "gen"


@pytest.fixture(scope="module")
def tuning_file(manifest_dir) -> Path:
    return _tuning([(SM90A, 4096, 4096, 4096), (SM90A, 128, 4096, 4096), (SM80, 1024, 1024, 1024),
                    ("gemm_not_in_this_manifest", 64, 64, 64)], manifest_dir.parent / "tuning.json")


# ---- fixed-point log2 -----------------------------------------------------------------------------

def test_log2_fixed_exact_on_powers_of_two_and_close_elsewhere():
    for e in range(0, 40):
        assert log2_fixed(1 << e) == e << 16
    rnd = random.Random(1)
    prev = -1
    for x in sorted(rnd.randrange(1, 1 << 33) for _ in range(2000)) + [3, 5, 7, 1000, 4095, 65537]:
        v = log2_fixed(x)
        assert abs(v / 65536 - math.log2(x)) < 2 ** -15
    for x in range(1, 5000):
        v = log2_fixed(x)
        assert v >= prev
        prev = v
    with pytest.raises(ValueError):
        log2_fixed(0)


# ---- the Python selection rule --------------------------------------------------------------------

def _cfg(a="bf16", la="row", lb="col", lc="row", arch="sm90a", tile=(128, 128, 64), align=8, act="identity",
         bias="none", acc="f32", batched=False):
    return {"arch": arch, "a": a, "b": a, "c": a, "d": a, "layout_a": la, "layout_b": lb, "layout_c": lc,
            "accumulator": acc, "tile": list(tile), "cluster": [1, 1, 1] if arch == "sm90a" else None,
            "alignment_a": align, "alignment_b": align, "alignment_c": align,
            "epilogue": {"activation": act, "bias": bias}, "split_k": "none", "batched": batched}


def _records(cfgs: dict[str, dict]) -> list[KernelRecord]:
    return kernel_records([{"name": n, "arch": c["arch"], "family": "gemm", "config": c} for n, c in cfgs.items()])


def _query(k: KernelRecord, m, n, kk, cc=90, batch=1, acc=None) -> Query:
    op = k.op if acc is None else Op(**{**k.op.__dict__, "acc": acc})
    return Query(op=op, m=m, n=n, k=kk, batch=batch, cc=cc)


def test_nearest_tuned_shape_first_then_fallback_rank():
    ks = _records({"big": _cfg(tile=(128, 256, 64)), "small": _cfg(tile=(64, 128, 64)),
                   "mid": _cfg(tile=(128, 128, 64)), "old": _cfg(arch="sm80", tile=(128, 128, 32)),
                   "other_dtype": _cfg(a="f16")})
    idx = {k.name: k.index for k in ks}
    ts = tuning_records([(idx["big"], 4096, 4096, 4096, 1), (idx["small"], 128, 4096, 4096, 1)])
    big = ks[idx["big"]]
    names = lambda q: [ks[c.kernel].name for c in candidate_order(ks, ts, q)]
    # near 4096^3: big first, then the winner of the next-nearest shape, then untuned by rank (sm90a before sm80)
    assert names(_query(big, 3000, 5000, 4096)) == ["big", "small", "mid", "old"]
    assert names(_query(big, 100, 4096, 4096)) == ["small", "big", "mid", "old"]
    # on an sm80 GPU the sm90a kernels drop out entirely
    assert names(_query(big, 100, 4096, 4096, cc=80)) == ["old"]
    # on sm89: 2.x kernels run on newer archs, sm90a only on exactly 90
    assert names(_query(big, 100, 4096, 4096, cc=89)) == ["old"]
    # exact operation match: the f16 kernel never serves bf16; accumulator "any" (0) or exact
    assert "other_dtype" not in names(_query(big, 64, 64, 64))
    assert names(_query(big, 64, 64, 64, acc=DTYPES["f16"])) == []
    # batched problems need batched kernels
    assert names(_query(big, 64, 64, 64, batch=4)) == []
    # record order breaks distance ties: (m, n, k) sorted, so the smaller shape wins a tie
    mid_q = _query(big, 724, 4096, 4096)   # log-equidistant-ish between 128 and 4096 in m
    order = candidate_order(ks, ts, mid_q)
    assert {ks[order[0].kernel].name, ks[order[1].kernel].name} == {"big", "small"}


def test_records_from_this_gpu_generation_come_first():
    ks = _records({"h100_pick": _cfg(tile=(128, 256, 64)), "a100_pick": _cfg(arch="sm80", tile=(128, 128, 32))})
    idx = {k.name: k.index for k in ks}
    # the A100 table's winner sits exactly at the problem's shape, the H100 table's far away
    ts = tuning_records([(idx["a100_pick"], 1000, 1000, 1000, 1, 80), (idx["h100_pick"], 8192, 8192, 8192, 1, 90)])
    order = lambda cc: [ks[c.kernel].name for c in candidate_order(ks, ts, _query(ks[0], 1000, 1000, 1000, cc=cc))]
    assert order(90) == ["h100_pick", "a100_pick"]
    assert order(80) == ["a100_pick"]
    # a record of unknown GPU counts as this generation's
    ts = tuning_records([(idx["a100_pick"], 1000, 1000, 1000, 1, 0), (idx["h100_pick"], 8192, 8192, 8192, 1, 90)])
    assert order(90) == ["a100_pick", "h100_pick"]


def test_fallback_rank_prefers_new_arch_wide_alignment_big_tile():
    ks = _records({"a_sm80": _cfg(arch="sm80"), "b_narrow": _cfg(align=2), "c_small": _cfg(tile=(64, 64, 64)),
                   "d_big": _cfg(tile=(256, 128, 64))})
    ranked = [k.name for k in sorted(ks, key=lambda k: k.fallback_rank)]
    assert ranked == ["d_big", "c_small", "b_narrow", "a_sm80"]
    assert [ks[c.kernel].name for c in candidate_order(ks, [], _query(ks[0], 64, 64, 64))] == ranked


def test_transposed_problem_and_can_implement_fallback():
    ks = _records({"tn": _cfg(), "tn_narrow": _cfg(align=2, tile=(64, 64, 64))})
    tn = ks[0]
    # D column-major with A row / B col: no direct kernel; D^T = B^T A^T is (row, col, row)
    q = Query(op=Op(**{**tn.op.__dict__, "lc": LAYOUTS["col"]}), m=300, n=200, k=64, cc=90)
    order = dispatch_order(ks, [], q)
    assert order and all(c.transposed for c in order)
    assert transpose(q).m == 200 and transpose(q).n == 300 and transpose(q).op.lc == LAYOUTS["row"]
    assert transpose(transpose(q)) == q
    # k = 1002: alignment 8 fails, alignment 2 works; k = 1001: none
    from emitter.library.dispatch import packed_can_implement
    q2 = _query(tn, 256, 256, 1002)
    assert ks[select(ks, [], q2, packed_can_implement).kernel].name == "tn_narrow"
    assert select(ks, [], _query(tn, 256, 256, 1001), packed_can_implement) is None


def test_bias_flips_under_transpose():
    per_row = Op(a=2, b=2, c=2, d=2, acc=3, la=1, lb=2, lc=1, act=0, bias=1)
    assert transpose(Query(op=per_row, m=10, n=20, k=30)).op.bias == 2


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
    from emitter.library.tuning import TuningError
    with pytest.raises(TuningError, match="schema_version 7"):
        export_library([manifest_dir], "mykernels", tmp_path / "y", tuning=[bad])
    bad.write_text(json.dumps({"schema_version": 1, "entries": [{"kernel": SM80, "problem": {"m": 0, "n": 1, "k": 1}}]}))
    with pytest.raises(TuningError, match="positive integer"):
        export_library([manifest_dir], "mykernels", tmp_path / "z", tuning=[bad])


def test_tuning_conflicts_and_op_mismatch(manifest_dir, tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"schema_version": 1, "entries": [
        {"problem": {"m": 256, "n": 256, "k": 256}, "kernel": SM90A,
         "op": {"a": "f16", "b": "f16", "c": "f16", "d": "f16", "layout_a": "row", "layout_b": "col", "layout_c": "row"}},
    ]}))
    r = export_library([manifest_dir], "mykernels", tmp_path / "o", tuning=[t])
    assert r.tuning == [] and "does not fit the kernel" in r.dropped_tuning[0]["reason"]


def test_cli_library(manifest_dir, tuning_file, tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(cli, ["library", str(manifest_dir), "--tuning", str(tuning_file), "--name", "mykernels",
                                   "-o", str(out), "--select", "arch=sm80"])
    assert res.exit_code == 0, res.output
    assert "library mykernels: 1 kernels (1 sm80), 1 tuned shapes" in res.output
    assert "gemm_not_in_this_manifest" in res.output
    res = CliRunner().invoke(cli, ["library", str(manifest_dir), "--name", "bad name", "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "not usable" in res.output and "Traceback" not in res.output


# ---- C++ agrees with Python (g++, host only) ------------------------------------------------------

def _synthetic_manifest(d: Path, rnd: random.Random, count: int) -> list[dict]:
    """A manifest of `count` random (never compiled) kernels: enough variety to exercise every rule."""
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(count):
        arch = rnd.choice(["sm80", "sm80", "sm86", "sm90a", "sm90a"])
        cfg = _cfg(a=rnd.choice(["bf16", "f16"]), la=rnd.choice(["row", "col"]), lb=rnd.choice(["row", "col"]),
                   lc=rnd.choice(["row", "col"]), arch=arch,
                   tile=(rnd.choice([64, 128, 256]), rnd.choice([64, 128, 256]), rnd.choice([32, 64])),
                   align=rnd.choice([2, 4, 8]), act=rnd.choice(["identity", "identity", "relu"]),
                   bias=rnd.choice(["none", "none", "row", "column"]), batched=rnd.random() < 0.2)
        name = f"gemm_{arch}_k{i:03d}"
        (d / f"{name}.cu").write_text("// not compiled\n")
        entries.append({"name": name, "family": "gemm", "arch": arch, "source": f"{name}.cu", "spec": "x.yaml",
                        "spec_hash": "0", "config": cfg})
    (d / "manifest.json").write_text(json.dumps({"schema_version": 1, "emitter_version": "0", "generated_at": None,
                                                 "specs": [], "instances": entries, "rejected": []}))
    return entries


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_cpp_dispatch_matches_python(tmp_path):
    rnd = random.Random(7)
    entries = _synthetic_manifest(tmp_path / "gen", rnd, 60)
    names = [e["name"] for e in entries]
    tuning = [(rnd.choice(names), rnd.choice([1, 16, 128, 1000, 4096]), rnd.choice([64, 1024, 4096, 12288]),
               rnd.choice([64, 512, 4096]), rnd.choice([1, 1, 8])) for _ in range(120)]
    tables = []
    for i, gpu in enumerate([{"cc": "9.0"}, {"cc": "8.0"}, None]):   # an H100 table, an A100 table, one of unknown GPU
        t = tmp_path / f"tuning{i}.json"
        t.write_text(json.dumps({"schema_version": 1, **({"gpu": gpu} if gpu else {}), "entries": [
            {"problem": {"m": m, "n": n, "k": k, "batch": b}, "kernel": name, "median_ms": rnd.random()}
            for name, m, n, k, b in tuning[i::3]]}))
        tables.append(t)
    out = tmp_path / "lib"
    r = export_library([tmp_path / "gen"], "probelib", out, tuning=tables)
    assert {t.gpu_cc for t in r.tuning} == {0, 80, 90}
    cxx = shutil.which("g++") or shutil.which("c++")
    exe = tmp_path / "probe"
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{out / 'src'}",
                    str(out / "tools/probelib_dispatch_probe.cpp"), str(out / "src/probelib_table.cpp"), "-o", str(exe)],
                   check=True)
    queries = []
    for _ in range(1500):
        k = rnd.choice(r.kernels)
        op = k.op if rnd.random() < 0.85 else Op(**{**k.op.__dict__, "lc": 3 - k.op.lc})   # some need the transpose
        if rnd.random() < 0.1:
            op = Op(**{**op.__dict__, "acc": 0})
        queries.append(Query(op=op, m=rnd.choice([1, 7, 64, 100, 777, 4096, 20000]), n=rnd.randrange(1, 20000),
                             k=rnd.randrange(1, 9000), batch=rnd.choice([1, 1, 1, 3, 8]), split_k=1,
                             cc=rnd.choice([80, 86, 89, 90, 90, 100])))
    lines = []
    for q in queries:
        o = q.op
        lines.append(" ".join(map(str, [o.a, o.b, o.c, o.d, o.acc, o.la, o.lb, o.lc, o.act, o.bias, q.m, q.n, q.k, q.batch,
                                         q.split_k, q.cc])))
    res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    got = res.stdout.splitlines()
    assert len(got) == len(queries)
    nonempty = 0
    for q, line in zip(queries, got):
        want = dispatch_order(r.kernels, r.tuning, q)
        text = " ".join(f"{c.kernel}:{c.tuning}:{int(c.transposed)}" for c in want) or "-"
        assert line == text, (q, line, text)
        nonempty += bool(want)
    assert nonempty > 300   # the queries hit real candidates, tuned and fallback, direct and transposed
    # the probe lists the same table (names sorted, ranks)
    listing = subprocess.run([str(exe), "--kernels"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert [l.split()[1] for l in listing] == [k.name for k in r.kernels]
    assert [int(l.split()[2].split("=")[1]) for l in listing] == [k.fallback_rank for k in r.kernels]


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="needs a C compiler")
def test_header_struct_layout_matches_loader(manifest_dir, tmp_path):
    """The public header is C (compiles with a C compiler) and its structs match the ctypes mirror."""
    out = tmp_path / "lib"
    export_library([manifest_dir], "mykernels", out)
    checks = []
    for struct, fields in (("mykernels_gemm_problem", abi.PROBLEM_FIELDS), ("mykernels_selection", abi.SELECTION_FIELDS),
                           ("mykernels_kernel_info", abi.KERNEL_INFO_FIELDS)):
        checks.append(f'printf("{struct} %zu\\n", sizeof({struct}));')
        for f, _ in fields:
            checks.append(f'printf("{struct}.{f} %zu\\n", offsetof({struct}, {f}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <mykernels/mykernels.h>\nint main(void) {\n"
                   + "\n".join(checks) + "\nreturn 0;\n}\n")
    cc = shutil.which("gcc") or shutil.which("cc")
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", f"-I{out / 'include'}", str(src), "-o", str(tmp_path / "layout")],
                   check=True)
    got = dict(l.rsplit(" ", 1) for l in subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                                                          check=True).stdout.splitlines())
    for struct, fields in (("mykernels_gemm_problem", abi.PROBLEM_FIELDS), ("mykernels_selection", abi.SELECTION_FIELDS),
                           ("mykernels_kernel_info", abi.KERNEL_INFO_FIELDS)):
        s = abi.structure("S", fields)
        assert int(got[struct]) == ctypes.sizeof(s), struct
        for f, _ in fields:
            assert int(got[f"{struct}.{f}"]) == getattr(s, f).offset, f"{struct}.{f}"


def test_loader_module_imports_without_gpu(manifest_dir, tmp_path):
    out = tmp_path / "lib"
    export_library([manifest_dir], "mykernels", out)
    sys.path.insert(0, str(out / "python"))
    try:
        import importlib
        mod = importlib.import_module("mykernels")
        assert mod.DTYPES["bf16"] == DTYPES["bf16"] and mod.ACTIVATIONS == ACTIVATIONS
        assert ctypes.sizeof(mod.Problem) == abi.sizes()["problem"]
        # layout from strides: row-major (m, k), and a transposed view (column-major)
        op = mod.Operand(0, (64, 32), (32, 1), "bf16")
        assert op.layout() == (LAYOUTS["row"], 32)
        assert mod.Operand(0, (32, 64), (1, 32), "bf16").layout() == (LAYOUTS["col"], 32)
        with pytest.raises(ValueError, match="neither row- nor column-major"):
            mod.Operand(0, (32, 64), (2, 64), "bf16").layout()
        os.environ["MYKERNELS_LIBRARY"] = str(tmp_path / "nowhere.so")
        with pytest.raises(OSError, match="libmykernels.so not found"):
            mod.load()
    finally:
        os.environ.pop("MYKERNELS_LIBRARY", None)
        sys.path.remove(str(out / "python"))
        sys.modules.pop("mykernels", None)


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
        assert syms == {f"mykernels_{f}" for f in __import__("emitter.library.export", fromlist=["x"]).API_FUNCTIONS}
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
