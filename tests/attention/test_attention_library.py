"""Attention in the exported library (issue 27 must-have 6), without a GPU: the family's library pieces
(emitter/families/attention/library.py, templates/attention/library/*), the C API compiled with g++ against a
stand-in CUDA runtime and fake attention shims (validation, refusals with their messages, the strides and
pointers handed to the shim, the dispatch order against the Python rule), and the header as C99. The Python
loader's attention() is tests/attention/test_attention_library_loader.py; real kernels on a GPU are
tests/attention/test_attention_library_gpu.py."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import ATTENTION_SM80_VARLEN_ENTRY, GEMM_SPEC  # noqa: E402
from library_helpers import _FAKE_CUDA, _FAKE_KERNELS, _compile  # noqa: E402

LIB = "attlib"
ATTENTION_SPEC = """\
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: [none, causal_bottom_right]
    lse: true
    gqa: true
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 128
    tile: 128x128
    schedule: cooperative
    mask: none
    lse: true
    gqa: true
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 128
    tile: [32x128, 64x64]
    mask: none
    lse: [false, true]
    gqa: true
""" + ATTENTION_SM80_VARLEN_ENTRY + """\
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 128
    tile: 128x128
    schedule: cooperative
    mask: causal_top_left
    key_tail: false
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 128
    tile: 128x128
    schedule: split_kv
    mask: none
    lse: true
    gqa: true
"""
SPEC = GEMM_SPEC + ATTENTION_SPEC
CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")


def export(tmp: Path, spec: str = SPEC, name: str = LIB):
    from emitter.emit import emit
    from emitter.library.export import export_library

    (tmp / "spec.yaml").write_text(spec)
    emit([tmp / "spec.yaml"], tmp / "gen", jobs=1)
    return export_library([tmp / "gen"], name, tmp / "lib")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("attlib")
    r = export(d)
    return d, r


def attention_kernels(out: Path):
    from emitter.families.attention.library import kernel_records
    from emitter.kit.library import DTYPES, LibraryError

    entries = [e for e in json.loads((out.parent / "gen" / "manifest.json").read_text())["instances"]
               if e.get("family") == "attention"]
    return kernel_records(entries, DTYPES, LibraryError)


# ---- the export ---------------------------------------------------------------------------------------------

def test_export_writes_the_attention_pieces(exported):
    d, r = exported
    out = d / "lib"
    ks = attention_kernels(out)
    assert len(ks) == 10                        # 9 + the split_kv (decode) kernel
    man = json.loads((out / "manifest.json").read_text())
    files = man["files"]
    cmake = (out / "CMakeLists.txt").read_text()
    for k in ks:
        src = (d / "gen" / [e for e in json.loads((d / "gen" / "manifest.json").read_text())["instances"]
                            if e["name"] == k.name][0]["source"]).read_text()
        assert (out / f"src/attention/{k.name}.cu").read_text() == src          # byte for byte
        for part in ("shim", "launch"):
            rel = f"src/attention/{k.name}.{part}.cu"
            assert rel in files and rel in cmake
        launch = (out / f"src/attention/{k.name}.launch.cu").read_text()
        assert "#define EMITTER_DEVICE 1" in launch and f"{LIB}_a_{k.name}_kernel<<<" in launch
        assert f"#define emitter_{k.name}_query {LIB}_a_{k.name}_query" in (out / f"src/attention/{k.name}.shim.cu").read_text()
    assert "src/curand_kernel.h" in files and "src/emitter_attention_abi.h" in files
    header = (out / f"include/{LIB}/{LIB}.h").read_text()
    for fn in ("attention", "attention_can_implement", "attention_workspace_size", "attention_select",
               "attention_problem_init"):
        assert f"{LIB}_{fn}(" in header
        assert f"{LIB}_{fn};" in (out / f"src/{LIB}.map").read_text()
    loader = (out / f"python/{LIB}.py").read_text()
    assert "def attention(" in loader and '"attention"' in loader
    compile(loader, "loader", "exec")
    # GEMM's part of the library is what a GEMM-only export writes
    (d / "gemm_only").mkdir(exist_ok=True)
    r2 = export(d / "gemm_only", GEMM_SPEC)
    g = d / "gemm_only" / "lib"
    assert (g / f"src/{LIB}_table.cpp").read_text() == (out / f"src/{LIB}_table.cpp").read_text()
    assert len(r2.kernels) == len(r.kernels) == 2


def test_export_is_deterministic_and_incremental(exported, tmp_path):
    from emitter.library.export import export_library

    d, _ = exported
    r = export_library([d / "gen"], LIB, d / "lib")
    assert r.written == []


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_header_is_c99_and_matches_the_loader_layout(exported, tmp_path):
    import ctypes

    from emitter.families.attention.library import PROBLEM_FIELDS, abi_sizes

    d, _ = exported
    src = tmp_path / "h.c"
    src.write_text(f'#include <stdio.h>\n#include <stddef.h>\n#include "{LIB}/{LIB}.h"\nint main(void) {{\n'
                   f'  printf("%zu %zu %zu\\n", sizeof({LIB}_attention_problem), offsetof({LIB}_attention_problem, q), '
                   f'sizeof({LIB}_attention_selection));\n  return 0;\n}}\n')
    exe = tmp_path / "h"
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{d / 'lib' / 'include'}", str(src),
                    "-o", str(exe)], check=True)
    got = list(map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()))
    s = abi_sizes()
    assert got == [s["problem_size"], s["problem_q_offset"], s["selection_size"]]
    assert ctypes.sizeof(ctypes.c_void_p) == 8 and len(PROBLEM_FIELDS) == 36


def test_a_family_arch_without_gemm_kernels_gets_its_own_cmake_group(tmp_path):
    """sm80 GEMM kernels beside an sm90a attention kernel: the library has an sm90a group holding the attention
    translation units alone (no GEMM kernel of that arch is needed)."""
    sm80_gemm = GEMM_SPEC.split("  - arch: sm90a")[0]
    sm90a_attention = ("  - family: attention\n    arch: sm90a\n    dtype: f16\n    head_dim: 128\n    tile: 128x128\n"
                       "    schedule: cooperative\n")
    r = export(tmp_path, sm80_gemm + sm90a_attention)
    assert {k.arch for k in r.kernels} == {"sm80"} and r.families == {"attention": 1}
    cmake = (tmp_path / "lib" / "CMakeLists.txt").read_text()
    sm90a = cmake.split(f"set(_{LIB}_sources_sm90a")[1].split(")")[0]
    assert "src/attention/" in sm90a and f"set(_{LIB}_gemm_kernels_sm90a 0)" in cmake


def test_python_order_rule():
    from emitter.families.attention.library import AttentionKernel, candidates
    from emitter.families.attention.model import Arch, AttentionInstance, Mask
    from emitter.dtypes import DType

    def k(i, arch, tq, tkv, lse=False, gqa=False):
        return AttentionKernel(i, f"k{i}", AttentionInstance(arch=arch, dtype=DType.f16, head_dim=128, head_dim_v=128,
                                                             tile_q=tq, tile_kv=tkv, lse=lse, gqa=gqa,
                                                             mask=Mask.none), 1)
    ks = [k(0, Arch.sm80, 32, 128), k(1, Arch.sm80, 64, 128), k(2, Arch.sm90a, 128, 128, lse=True),
          k(3, Arch.sm80, 32, 64, lse=True)]
    q = dict(dtype=1, head_dim=128, head_dim_v=128, mask=0, varlen=False, heads_q=8, heads_kv=8, seq_k=1024, lse=False)
    assert [c.index for c in candidates(ks, cc=90, seq_q=4096, **q)] == [2, 1, 0, 3]   # sm90a first on cc 9.0
    assert [c.index for c in candidates(ks, cc=90, seq_q=100, **q)] == [2, 0, 1, 3]    # short: small tiles first
    assert [c.index for c in candidates(ks, cc=80, seq_q=4096, **q)] == [1, 0, 3]      # no sm90a on sm_80
    assert [c.index for c in candidates(ks, cc=90, seq_q=4096, **dict(q, lse=True))] == [2, 3]
    assert [c.index for c in candidates(ks, cc=90, seq_q=4096, **dict(q, heads_kv=2))] == []   # no GQA kernel


# ---- the C API with fake shims ---------------------------------------------------------------------------

_FAKE_ATTENTION = r"""
#include <cstdio>
#include <cstring>
#include "emitter_abi.h"
#include "emitter_attention_abi.h"
emitter_attention_problem g_last;
int g_run = -1, g_refuse = 0, g_queries = 0;
void* g_ws = nullptr;
static int query_(int i, const emitter_attention_problem* p, emitter_launch* out) {
  ++g_queries;
  if ((g_refuse >> i) & 1) return EMITTER_CANNOT_IMPLEMENT;
  std::memset(out, 0, sizeof(*out));
  out->workspace_bytes = i == 1 ? 1000 : 0;
  (void)p;
  return EMITTER_OK;
}
static int run_(int i, const emitter_attention_problem* p, void* ws, void*, int*) {
  if ((g_refuse >> i) & 1) return EMITTER_CANNOT_IMPLEMENT;
  g_last = *p; g_run = i; g_ws = ws;
  return EMITTER_OK;
}
%(defs)s
"""

_MAIN = r"""
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include "%(lib)s/%(lib)s.h"
#include "emitter_abi.h"
#include "emitter_attention_abi.h"
extern emitter_attention_problem g_last;
extern int g_run, g_refuse;
int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    long long v[32];
    for (long long& x : v) in >> x;
    std::string kernel;
    std::string scale_text;
    in >> scale_text >> kernel;
    const float scale = std::strtof(scale_text.c_str(), nullptr);
    %(lib)s_attention_problem p;
    %(lib)s_attention_problem_init(&p);
    p.dtype = int(v[0]); p.mask = int(v[1]); p.batch = int(v[2]); p.heads_q = int(v[3]); p.heads_kv = int(v[4]);
    p.seq_q = int(v[5]); p.seq_k = int(v[6]); p.head_dim = int(v[7]); p.head_dim_v = int(v[8]);
    p.total_q = int(v[9]); p.total_k = int(v[10]); p.scale = scale;
    int64_t* s = &p.q_stride_batch;
    for (int i = 0; i < 14; ++i) s[i] = v[11 + i];
    p.q = (const void*)(uintptr_t)v[25]; p.k = (const void*)(uintptr_t)v[26]; p.v = (const void*)(uintptr_t)v[27];
    p.o = (void*)(uintptr_t)v[28]; p.lse = (float*)(uintptr_t)v[29];
    p.cu_seqlens_q = p.cu_seqlens_k = v[30] ? (const int32_t*)(uintptr_t)0x7000000 : nullptr;
    g_refuse = int(v[31]);
    if (kernel != "-") p.kernel = kernel.c_str();
    %(lib)s_attention_selection sel;
    sel.struct_size = sizeof(sel);
    int ss = %(lib)s_attention_select(&p, &sel);
    size_t ws = 0;
    int ws_status = %(lib)s_attention_workspace_size(&p, &ws);
    g_run = -1;
    int st = %(lib)s_attention(&p, nullptr, 0, nullptr);
    std::printf("%%d %%d %%d %%d %%zu %%d", st, g_run, ss, ss == 0 ? sel.kernel : -1, ws, ws_status);
    const emitter_attention_problem& e = g_last;
    if (st == 0) {
      std::printf(" %%d %%d %%d %%d %%d %%d %%d %%g %%d %%d", e.batch, e.heads_q, e.heads_kv, e.seq_q, e.seq_k, e.head_dim,
                  e.head_dim_v, double(e.scale), e.total_q, e.total_k);
      const int64_t* es[4] = {e.stride_q, e.stride_k, e.stride_v, e.stride_o};
      for (int t = 0; t < 4; ++t) for (int i = 0; i < 3; ++i) std::printf(" %%lld", (long long)es[t][i]);
      std::printf(" %%lld %%lld", (long long)e.stride_lse[0], (long long)e.stride_lse[1]);
    }
    std::printf(" | %%s\n", %(lib)s_last_error());
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def api(exported):
    if CXX is None:
        pytest.skip("needs a host C++ compiler")
    d, r = exported
    out = d / "lib"
    fake = d / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib=LIB, rows=rows))
    ks = attention_kernels(out)
    defs = "\n".join(
        f'extern "C" int {LIB}_a_{k.name}_query(const emitter_attention_problem* p, emitter_launch* o) '
        f"{{ return query_({k.index}, p, o); }}\n"
        f'extern "C" int {LIB}_a_{k.name}_run(const emitter_attention_problem* p, void* w, void* s, int* c) '
        f"{{ return run_({k.index}, p, w, s, c); }}" for k in ks)
    (fake / "fake_attention.cpp").write_text(_FAKE_ATTENTION % {"defs": defs})
    (fake / "main.cpp").write_text(_MAIN % {"lib": LIB})
    exe = d / "api"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / f"src/{LIB}_api.cpp"), str(out / f"src/{LIB}_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "fake_attention.cpp"), str(fake / "main.cpp"), "-o", str(exe)])
    names = {k.name: k.index for k in ks}

    def run(cases: list[dict]) -> list[dict]:
        lines = []
        for c in cases:
            s = c.get("strides", [0] * 14)
            v = [c.get("dtype", 1), c.get("mask", 0), c.get("batch", 2), c.get("hq", 8), c.get("hkv", 2),
                 c.get("sq", 100), c.get("sk", 130), c.get("d", 64), c.get("dv", c.get("d", 64)), c.get("tq", 0),
                 c.get("tk", 0), *s, *[x - (1 << 64) if x >= 1 << 63 else x for x in c.get("ptrs", [1 << 32, 2 << 32, 3 << 32, 4 << 32, 0])],
                 1 if c.get("varlen") else 0, c.get("refuse", 0)]
            lines.append(" ".join(map(str, v)) + f" {c.get('scale', 0)} {c.get('kernel', '-')}")
        res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        out_ = []
        for line in res.stdout.splitlines():
            head, _, msg = line.partition(" | ")
            nums = head.split()
            rec = {"status": int(nums[0]), "run": int(nums[1]), "select_status": int(nums[2]), "selected": int(nums[3]),
                   "workspace": int(nums[4]), "message": msg}
            if len(nums) > 6:
                e = [float(x) if "." in x or "e" in x else int(x) for x in nums[6:]]
                rec["e"] = e
            out_.append(rec)
        assert len(out_) == len(cases)
        return out_

    run.names = names
    run.kernels = ks
    return run


def test_c_api_refuses_bad_problems(api):
    big = 1 << 61
    bad = [
        (dict(dtype=3), 2, "DTYPE_F16"),
        (dict(mask=3), 2, "MASK"),
        (dict(batch=0), 2, ">= 1"),
        (dict(hq=8, hkv=3), 2, "does not divide"),
        (dict(sk=0), 2, ">= 1"),
        (dict(scale=-1.0), 2, "scale"),
        (dict(scale=float("nan")), 2, "scale"),
        (dict(scale=float("inf")), 2, "scale"),
        (dict(tq=5), 2, "only with cu_seqlens"),
        (dict(varlen=True, dtype=2, mask=1, tq=50, tk=60, sq=100, sk=30), 2, "at least seq_q"),
        (dict(strides=[-1] + [0] * 13), 2, "negative"),
        (dict(strides=[0] * 9 + [0, 64, 64] + [0, 0]), 2, "overlap"),             # O rows alias across heads
        (dict(strides=[0] * 9 + [0, 0, 0] + [0, 0], ptrs=[1 << 32, 2 << 32, 3 << 32, 1 << 32, 0]), 2, "alias"),
        (dict(strides=[big, 0, 0] + [0] * 11, batch=3), 2, "2^62"),
        (dict(ptrs=[(1 << 64) - 4096, 2 << 32, 3 << 32, 4 << 32, 0]), 2, "address space"),
        (dict(ptrs=[0, 2 << 32, 3 << 32, 4 << 32, 0]), 2, "device pointers"),
        (dict(d=96, dv=96), 1, "no attention kernel"),
        (dict(kernel="nope"), 5, "no attention kernel named"),
        (dict(ptrs=[1 << 32, 2 << 32, 3 << 32, 4 << 32, 5 << 32], strides=[0] * 12 + [0, 50]), 2, "overlap"),   # lse rows
        (dict(ptrs=[1 << 32, 2 << 32, 3 << 32, 4 << 32, 4 << 32]), 2, "lse overlaps O"),
        (dict(hq=4, hkv=4, d=128, sk=130, mask=1), 1, "no attention kernel"),   # the top-left kernel has no key tail
    ]
    res = api([c for c, _, _ in bad])
    for (case, status, needle), r in zip(bad, res):
        assert r["status"] == status and needle in r["message"], (case, r)
        assert r["run"] == -1, (case, r)
    # the key-tail-less top-left kernel runs when seq_k is a tile multiple
    ok = api([dict(hq=4, hkv=4, d=128, sk=256, mask=1)])[0]
    assert ok["status"] == 0 and api.kernels[ok["run"]].inst.key_tail is False


def test_c_api_passes_resolved_strides_and_pointers(api):
    # packed BSHD from zeros: (b, s, h) strides (S*H*D, H*D, D)
    r = api([dict(batch=2, hq=8, hkv=2, sq=100, sk=130, d=64)])[0]
    assert r["status"] == 0, r
    e = r["e"]
    assert e[:10] == [2, 8, 2, 100, 130, 64, 64, 0, 0, 0]
    assert e[10:22] == [100 * 8 * 64, 8 * 64, 64, 130 * 2 * 64, 2 * 64, 64, 130 * 2 * 64, 2 * 64, 64,
                        100 * 8 * 64, 8 * 64, 64]
    assert e[22:] == [0, 0]
    # explicit BHSD strides and an LSE with padding
    s = [8 * 100 * 64, 64, 100 * 64, 2 * 130 * 64, 64, 130 * 64, 2 * 130 * 64, 64, 130 * 64, 8 * 100 * 64, 64, 100 * 64,
         8 * 112, 112]
    r = api([dict(strides=s, ptrs=[1 << 32, 2 << 32, 3 << 32, 4 << 32, 5 << 32], scale=0.25)])[0]
    assert r["status"] == 0, r
    assert r["e"][7] == 0.25 and r["e"][10:] == s
    # varlen: batch strides 0, totals passed, LSE [heads, total]
    r = api([dict(varlen=True, dtype=2, mask=1, batch=3, sq=40, sk=50, tq=100, tk=120,
                  ptrs=[1 << 32, 2 << 32, 3 << 32, 4 << 32, 5 << 32])])[0]
    assert r["status"] == 0, r
    assert r["e"][8:10] == [100, 120] and r["e"][10] == 0 and r["e"][11] == 8 * 64 and r["e"][22:] == [0, 100]


def test_c_api_dispatch_order_matches_python(api):
    from emitter.families.attention.library import candidates
    from emitter.kit.library import DTYPES

    rnd = random.Random(27)
    cases = []
    for _ in range(400):
        varlen = rnd.random() < 0.2
        hq = rnd.choice((4, 8))
        c = dict(dtype=rnd.choice((1, 1, 2)), mask=rnd.choice((0, 0, 1, 2)), batch=rnd.randint(1, 3), hq=hq,
                 hkv=rnd.choice((hq, hq // 2, 1)), sq=rnd.choice((1, 100, 512, 4096)), sk=rnd.choice((64, 128, 130, 4096)),
                 d=rnd.choice((64, 128)), varlen=varlen, refuse=rnd.choice((0, 0, rnd.randint(0, 255))),
                 ptrs=[1 << 32, 2 << 32, 3 << 32, 4 << 32, rnd.choice((0, 5 << 32))])
        if varlen:
            c.update(tq=c["sq"] * 2, tk=c["sk"] * 2)
        cases.append(c)
    res = api(cases)
    ran = refused = 0
    for c, r in zip(cases, res):
        order = candidates(api.kernels, cc=90, dtype=c["dtype"], head_dim=c["d"], head_dim_v=c["d"], mask=c["mask"],
                           varlen=c["varlen"], heads_q=c["hq"], heads_kv=c["hkv"], seq_q=c["sq"], seq_k=c["sk"],
                           lse=c["ptrs"][4] != 0)
        accepting = [k.index for k in order if not (c["refuse"] >> k.index) & 1]
        if accepting:
            assert r["status"] == 0 and r["run"] == accepting[0] == r["selected"], (c, r, [k.index for k in order])
            assert r["workspace"] == (1000 + 256 if 1 in accepting else 0), (c, r)
            ran += 1
        else:
            assert r["status"] == 1 and r["run"] == -1, (c, r)
            refused += 1
    assert ran > 100 and refused > 50, (ran, refused)
    assert DTYPES["f16"] == 1


def test_c_api_forced_kernel(api):
    name = [n for n, i in api.names.items() if "sm80_f16_d128_64x64" in n and "lse" not in n][0]
    r = api([dict(d=128, kernel=name, hq=8, hkv=8)])[0]
    assert r["status"] == 0 and r["run"] == api.names[name]
    r = api([dict(d=64, kernel=name)])[0]                  # it does not compute d64
    assert r["status"] == 1 and "does not compute" in r["message"]
