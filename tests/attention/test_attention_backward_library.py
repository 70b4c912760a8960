"""Attention backward in the exported library, without a GPU: the pieces (files, header, C functions, the
loader's functions), the header as C99 with the layout the loader packs, the rendered loader as Python, and
the C API compiled with g++ against a stand-in CUDA runtime and fake backward shims: validation and its
messages, what the shim is handed (strides resolved, pointers), dispatch (key-split kernels before
deterministic ones unless determinism is asked for), the workspace, the refusal of a library without a forward."""

from __future__ import annotations

import ctypes
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC  # noqa: E402
from library_helpers import _FAKE_CUDA, _FAKE_KERNELS, _compile  # noqa: E402

LIB = "bwlib"
BACKWARD_SPEC = """\
  - family: attention
    op: forward
    arch: sm80
    dtype: bf16
    head_dim: 64
    tile: 64x64
    mask: causal_top_left
    lse: true
    gqa: true
  - family: attention
    op: backward
    arch: sm80
    dtype: bf16
    head_dim: 64
    tile: [64x64, 128x128]
    mask: causal_top_left
    gqa: true
    deterministic: [true, false]
"""
CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")


def export(tmp: Path, spec: str, name: str = LIB):
    from emitter.emit import emit
    from emitter.library.export import export_library

    (tmp / "spec.yaml").write_text(spec)
    emit([tmp / "spec.yaml"], tmp / "gen", jobs=1)
    return export_library([tmp / "gen"], name, tmp / "lib")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("bwlib")
    return d, export(d, GEMM_SPEC + BACKWARD_SPEC)


def bnames(out: Path) -> list[str]:
    import json

    m = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else None
    assert m is not None
    return sorted(p.split("/")[-1][:-len(".launch.cu")] for p in m["files"] if p.endswith(".launch.cu")
                  and "/attention/attn_bwd_" in p)


def test_export_writes_the_backward_pieces(exported):
    d, r = exported
    out = d / "lib"
    names = bnames(out)
    assert len(names) == 4
    for n in names:
        for suffix in (".cu", ".shim.cu", ".launch.cu"):
            assert (out / "src" / "attention" / f"{n}{suffix}").is_file()
    assert (out / "src" / "emitter_attention_backward_abi.h").is_file()
    header = (out / "include" / LIB / f"{LIB}.h").read_text()
    assert f"{LIB}_attention_backward(const {LIB}_attention_backward_problem*" in header
    exported_syms = (out / "src" / f"{LIB}.map").read_text()
    for f in ("attention_backward", "attention_backward_workspace_size", "attention_backward_kernel_name"):
        assert f"{LIB}_{f};" in exported_syms
    loader = out / "python" / f"{LIB}.py"
    py_compile.compile(str(loader), doraise=True)
    text = loader.read_text()
    assert "register_autograd" in text and "def attention_backward(" in text


def test_a_backward_without_a_forward_is_refused(tmp_path):
    from emitter.kit.library import LibraryError

    only_backward = BACKWARD_SPEC.split("  - family: attention\n    op: backward")[1]
    with pytest.raises(LibraryError, match="without a forward"):
        export(tmp_path, GEMM_SPEC + "  - family: attention\n    op: backward" + only_backward)


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_header_is_c99_and_matches_the_loader_layout(exported, tmp_path):
    from emitter.families.attention.backward_library import abi_sizes

    d, _ = exported
    src = tmp_path / "h.c"
    src.write_text(f'#include <stdio.h>\n#include <stddef.h>\n#include "{LIB}/{LIB}.h"\nint main(void) {{\n'
                   f'  printf("%zu %zu\\n", sizeof({LIB}_attention_backward_problem), '
                   f'offsetof({LIB}_attention_backward_problem, q));\n  return 0;\n}}\n')
    exe = tmp_path / "h"
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{d / 'lib' / 'include'}", str(src),
                    "-o", str(exe)], check=True)
    got = list(map(int, subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()))
    s = abi_sizes()
    assert got == [s["bproblem_size"], s["bproblem_q_offset"]]


_FAKE_BACKWARD = r"""
#include <cstring>
#include "emitter_abi.h"
#include "emitter_attention_backward_abi.h"
emitter_attention_backward_problem g_blast;
int g_brun = -1, g_brefuse = 0;
void* g_bws = nullptr;
static int bquery_(int i, const emitter_attention_backward_problem*, emitter_launch* out) {
  if ((g_brefuse >> i) & 1) return EMITTER_CANNOT_IMPLEMENT;
  std::memset(out, 0, sizeof(*out));
  out->workspace_bytes = 1000 + i;
  return EMITTER_OK;
}
static int brun_(int i, const emitter_attention_backward_problem* p, void* ws, void*, int*) {
  if ((g_brefuse >> i) & 1) return EMITTER_CANNOT_IMPLEMENT;
  g_blast = *p; g_brun = i; g_bws = ws;
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
#include "emitter_attention_backward_abi.h"
extern emitter_attention_backward_problem g_blast;
extern int g_brun, g_brefuse;
int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    // dtype mask batch hq hkv sq sk d det lse dq_seq_stride refuse kernel dq_ptr
    long long v[13];
    for (long long& x : v) in >> x;
    std::string kernel;
    in >> kernel;
    %(lib)s_attention_backward_problem p;
    %(lib)s_attention_backward_problem_init(&p);
    p.dtype = int(v[0]); p.mask = int(v[1]); p.batch = int(v[2]); p.heads_q = int(v[3]); p.heads_kv = int(v[4]);
    p.seq_q = int(v[5]); p.seq_k = int(v[6]); p.head_dim = p.head_dim_v = int(v[7]); p.deterministic = int(v[8]);
    const uintptr_t G = uintptr_t(1) << 36;
    p.q = (const void*)(1 * G); p.k = (const void*)(2 * G); p.v = (const void*)(3 * G); p.o = (const void*)(4 * G);
    p.d_o = (const void*)(5 * G); p.lse = v[9] ? (const float*)(6 * G) : nullptr;
    p.dq = (void*)(uintptr_t)v[12]; p.dk = (void*)(8 * G); p.dv = (void*)(9 * G);
    p.dq_stride_seq = v[10];
    g_brefuse = int(v[11]);
    if (kernel != "-") p.kernel = kernel.c_str();
    size_t ws = 0;
    const int ws_status = %(lib)s_attention_backward_workspace_size(&p, &ws);
    g_brun = -1;
    const int st = %(lib)s_attention_backward(&p, nullptr, 0, nullptr);
    std::printf("%%d %%d %%zu %%d", st, g_brun, ws, ws_status);
    if (st == 0) {
      const emitter_attention_backward_problem& e = g_blast;
      std::printf(" %%d %%d %%d %%d %%d", e.batch, e.heads_q, e.heads_kv, e.seq_q, e.seq_k);
      const int64_t* s[4] = {e.stride_do, e.stride_dq, e.stride_dk, e.stride_dv};
      for (int t = 0; t < 4; ++t) for (int i = 0; i < 3; ++i) std::printf(" %%lld", (long long)s[t][i]);
      std::printf(" %%d", e.dq == p.dq && e.lse == p.lse && e.d_o == p.d_o ? 1 : 0);
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
            v = [c.get("dtype", 2), c.get("mask", 1), c.get("batch", 2), c.get("hq", 8), c.get("hkv", 2),
                 c.get("sq", 100), c.get("sk", 130), c.get("d", 64), c.get("det", 0), c.get("lse", 1),
                 c.get("dq_seq", 0), c.get("refuse", 0), c.get("dq_ptr", 7 << 36)]
            lines.append(" ".join(map(str, v)) + f" {c.get('kernel', '-')}")
        res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
        out_ = []
        for line in res.stdout.splitlines():
            head, _, msg = line.partition(" | ")
            nums = [int(x) for x in head.split()]
            out_.append({"status": nums[0], "run": nums[1], "workspace": nums[2], "ws_status": nums[3], "e": nums[4:],
                         "message": msg})
        assert len(out_) == len(cases)
        return out_

    run.names = names
    return run


def test_c_api_refuses_bad_backward_problems(api):
    bad = [
        (dict(lse=0), 2, "LSE"),
        (dict(det=2), 2, "deterministic"),
        (dict(hkv=3), 2, "does not divide"),
        (dict(dq_ptr=(2 << 36) + 64), 2, "dQ overlaps K"),           # a gradient aliasing an input
        (dict(dtype=1), 1, "no attention backward kernel"),        # f16: the library has bf16 kernels only
        (dict(mask=2), 1, "no attention backward kernel"),
        (dict(d=128), 1, "no attention backward kernel"),
        (dict(kernel="nope"), 5, "no attention backward kernel named"),
    ]
    res = api([c for c, _, _ in bad])
    for (case, status, words), r in zip(bad, res):
        assert r["status"] != 0 and r["run"] == -1, (case, r)
        if status is not None:
            assert r["status"] == status, (case, r)
        assert words in r["message"], (case, r)


def test_c_api_dispatch_order_and_what_the_shim_gets(api):
    names = api.names                                   # sorted: 128x128, 128x128_det, 64x64, 64x64_det
    idx = {n: i for i, n in enumerate(names)}
    split_small = idx["attn_bwd_sm80_bf16_d64_64x64_causaltl_bshd_gqa"]
    det_small = idx["attn_bwd_sm80_bf16_d64_64x64_causaltl_bshd_gqa_det"]
    split_big = idx["attn_bwd_sm80_bf16_d64_128x128_causaltl_bshd_gqa"]
    r = api([dict(), dict(det=1), dict(sq=1000, sk=1000), dict(refuse=1 << split_small), dict(kernel=names[det_small])])
    assert r[0]["status"] == 0 and r[0]["run"] == split_small, r[0]      # short: key splits, the small tile first
    assert r[1]["status"] == 0 and r[1]["run"] == det_small, r[1]        # deterministic asked: only those
    assert r[2]["status"] == 0 and r[2]["run"] == split_big, r[2]        # long: the large tile first
    assert r[3]["status"] == 0 and r[3]["run"] == split_big, r[3]        # a refusing shim: the next one
    assert r[4]["status"] == 0 and r[4]["run"] == det_small, r[4]        # forced by name
    e = r[0]["e"]
    assert e[:5] == [2, 8, 2, 100, 130]
    # packed BSHD strides resolved for dO (like O), dQ, dK, dV: (batch, seq, head)
    assert e[5:17] == [100 * 8 * 64, 8 * 64, 64, 100 * 8 * 64, 8 * 64, 64, 130 * 2 * 64, 2 * 64, 64, 130 * 2 * 64, 2 * 64, 64]
    assert e[17] == 1                                                   # the caller's pointers, unchanged
    assert r[0]["workspace"] >= 1000 and r[0]["ws_status"] == 0


def test_torch_ops_and_autograd_registration(exported):
    """torch.ops.<lib>.attention_backward's fake gives the gradients' shapes, and loss.backward() through the
    forward op reaches it (traced with fake tensors: no GPU, no library call); a forward run without its LSE
    is refused at backward with the fix."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from _helpers import load_module

    d, _ = exported
    mod = load_module(LIB, d / "lib" / "python" / f"{LIB}.py")
    ns = mod.register_attention_backward_ops()
    with FakeTensorMode():
        q = torch.empty(2, 10, 8, 64, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(2, 10, 2, 64, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(2, 10, 2, 64, dtype=torch.bfloat16, requires_grad=True)
        o, lse = ns.attention(q, k, v, True, "top_left", None, True, None, None, None, None, None)
        o.float().sum().backward()
        assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
        o, lse = ns.attention(q, k, v, True, "top_left", None, False, None, None, None, None, None)
        with pytest.raises(RuntimeError, match="without its LSE"):
            o.float().sum().backward()
