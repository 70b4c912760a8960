"""The sm90a attention backward in the exported library, without a GPU: `emitter library` takes sm90a backward
instances beside sm80 ones (their translation units in the sm90a CMake group), and the C API's dispatch, compiled
with g++ against the stand-in CUDA runtime (an sm_90 device) and fake shims, runs the sm90a kernel where it
computes the problem (f16 or bf16, with or without GQA) and the sm80 kernel otherwise (deterministic asked, a
refusing sm90a shim); the static order is the same for both dtypes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC  # noqa: E402
from test_attention_backward_library import _FAKE_BACKWARD, _MAIN, CXX, bnames, export  # noqa: E402
from library_helpers import _FAKE_CUDA, _FAKE_KERNELS, _compile  # noqa: E402

LIB = "bwlib"     # _MAIN and _FAKE_BACKWARD are written for this library name
SPEC = """\
  - family: attention
    op: forward
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    lse: true
    gqa: true
  - family: attention
    op: backward
    arch: sm80
    dtype: f16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    gqa: true
    deterministic: [true, false]
  - family: attention
    op: backward
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 64x128
    mask: causal_top_left
    gqa: true
    deterministic: false
  - family: attention
    op: backward
    arch: sm90a
    dtype: f16
    head_dim: 64
    tile: 128x128
    mask: causal_top_left
    gqa: true
    deterministic: false
    dq_split: true
  - family: attention
    op: backward
    arch: sm80
    dtype: bf16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    gqa: true
    deterministic: false
  - family: attention
    op: backward
    arch: sm90a
    dtype: bf16
    head_dim: 64
    tile: 64x128
    mask: causal_top_left
    gqa: true
    deterministic: false
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    if CXX is None:
        pytest.skip("needs a host C++ compiler")
    d = tmp_path_factory.mktemp("bw90lib")
    r = export(d, GEMM_SPEC + SPEC, LIB)
    out = d / "lib"
    fake = d / "fake"
    fake.mkdir(exist_ok=True)
    (fake / "cuda_runtime_api.h").write_text(_FAKE_CUDA)
    rows = "\n".join(f"  {{&query<{k.index}>, &run<{k.index}>}}," for k in r.kernels)
    (fake / "fake_kernels.cpp").write_text(_FAKE_KERNELS.format(lib=LIB, rows=rows))
    names = bnames(out)
    defs = "\n".join(
        f'extern "C" int {LIB}_ab_{n}_query(const emitter_attention_backward_problem* p, emitter_launch* o) '
        f"{{ return bquery_({i}, p, o); }}\n"
        f'extern "C" int {LIB}_ab_{n}_run(const emitter_attention_backward_problem* p, void* w, void* s, int* c) '
        f"{{ return brun_({i}, p, w, s, c); }}" for i, n in enumerate(names))
    (fake / "fake_backward.cpp").write_text(_FAKE_BACKWARD % {"defs": defs})
    (fake / "main.cpp").write_text(_MAIN % {"lib": LIB})
    exe = d / "bapi"
    _compile([f"-I{fake}", f"-I{out / 'include'}", f"-I{out / 'src'}", "-Wno-unused-parameter",
              str(out / f"src/{LIB}_api.cpp"), str(out / f"src/{LIB}_table.cpp"), str(fake / "fake_kernels.cpp"),
              str(fake / "fake_backward.cpp"), str(fake / "main.cpp"), "-o", str(exe)])

    def run(cases: list[dict]) -> list[dict]:
        lines = []
        for c in cases:
            v = [c.get("dtype", 1), c.get("mask", 1), c.get("batch", 2), c.get("hq", 8), c.get("hkv", 8),
                 c.get("sq", 100), c.get("sk", 130), c.get("d", 64), c.get("det", 0), c.get("lse", 1),
                 c.get("dq_seq", 0), c.get("refuse", 0), c.get("dq_ptr", 7 << 36)]
            lines.append(" ".join(map(str, v)) + f" {c.get('kernel', '-')}")
        res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        out_ = []
        for line in res.stdout.splitlines():
            head, _, msg = line.partition(" | ")
            nums = [int(x) for x in head.split()]
            out_.append({"status": nums[0], "run": nums[1], "message": msg})
        return out_

    run.names = names
    run.out = out
    return run


def test_export_puts_the_sm90a_backward_in_the_sm90a_group(api):
    names = api.names
    assert sum(n.startswith("attn_bwd_sm90a_") for n in names) == 3 and len(names) == 6
    cmake = (api.out / "CMakeLists.txt").read_text()
    # each arch's translation units in its own CMake group (the sm90a group builds for 90a)
    groups = {arch: cmake.split(f"set(_{LIB}_sources_{arch}\n")[1].split(")")[0] for arch in ("sm80", "sm90a")}
    for n in names:
        arch = "sm90a" if n.startswith("attn_bwd_sm90a_") else "sm80"
        for tu in (f"src/attention/{n}.launch.cu", f"src/attention/{n}.shim.cu"):
            assert tu in groups[arch] and tu not in groups[{"sm80": "sm90a", "sm90a": "sm80"}[arch]], (n, tu)
    assert f'set(_{LIB}_default_sm90a "90a")' in cmake


def test_dispatch_prefers_sm90a_where_it_computes_the_problem(api):
    idx = {n: i for i, n in enumerate(api.names)}
    s90_small = idx["attn_bwd_sm90a_f16_d64_64x128_causaltl_bshd_gqa"]
    s90_big = idx["attn_bwd_sm90a_f16_d64_128x128_causaltl_bshd_gqa_dqsplit"]
    s80 = idx["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa"]
    s80_det = idx["attn_bwd_sm80_f16_d64_64x64_causaltl_bshd_gqa_det"]
    b90 = idx["attn_bwd_sm90a_bf16_d64_64x128_causaltl_bshd_gqa"]
    b80 = idx["attn_bwd_sm80_bf16_d64_64x64_causaltl_bshd_gqa"]
    r = api([dict(), dict(sq=1000, sk=1000), dict(hkv=2), dict(det=1), dict(refuse=(1 << s90_small) | (1 << s90_big)),
             dict(dtype=2), dict(dtype=2, hkv=2), dict(dtype=2, refuse=1 << b90), dict(dtype=2, det=1)])
    # the split-dQ kernel first at any length (short problems would otherwise take the smaller tile first)
    assert r[0]["status"] == 0 and r[0]["run"] == s90_big, r[0]         # MHA f16: the sm90a split-dQ kernel
    assert r[1]["status"] == 0 and r[1]["run"] == s90_big, r[1]         # long: the same
    assert r[2]["status"] == 0 and r[2]["run"] == s90_big, r[2]         # GQA: the sm90a kernel too
    r2 = api([dict(refuse=1 << s90_big), dict(sq=1000, sk=1000, refuse=1 << s90_big)])
    assert [x["run"] for x in r2] == [s90_small, s90_small], r2         # its shim refuses: upstream's dQ next
    assert r[3]["status"] == 0 and r[3]["run"] == s80_det, r[3]         # deterministic asked: only sm80's
    assert r[4]["status"] == 0 and r[4]["run"] == s80, r[4]             # the sm90a shims refuse: the next one
    assert r[5]["status"] == 0 and r[5]["run"] == b90, r[5]             # bf16: the sm90a kernel too
    assert r[6]["status"] == 0 and r[6]["run"] == b90, r[6]             # bf16 GQA
    assert r[7]["status"] == 0 and r[7]["run"] == b80, r[7]             # its shim refuses: sm80's bf16 kernel
    assert r[8]["status"] != 0 and "no attention backward kernel" in r[8]["message"], r[8]   # no deterministic bf16
