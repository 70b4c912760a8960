"""Attention through an exported library on the GPU (issue 27 must-have 6): emit -> `emitter library` -> CMake
build of a library holding real sm90a and sm80 attention kernels (plus the two GEMM kernels a library needs for
its arch groups), then the Python loader's attention() against a float64 reference and torch SDPA: GQA, causal
from the top left and from the bottom right, run-time scale, LSE, sequence lengths that are not tile multiples,
query lengths that are not multiples of 8 (sm90a runs them, no fall-through to sm80), a forced sm80 kernel, variable lengths,
torch.compile(fullgraph=True) and CUDA graph capture + replay.

    python3 -m pytest -q -m gpu tests/attention/test_attention_library_gpu.py          (about 3 minutes on 16 cores)

$EMITTER_ATTENTION_LIBRARY=<dir> reuses an exported tree built before (its build/ folder);
$EMITTER_TEST_JOBS sets the build's -j (default 16)."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import ATTENTION_SM80_VARLEN_ENTRY, GEMM_SPEC, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "attgpu"

SPEC = GEMM_SPEC + """\
  - family: attention
    arch: sm90a
    dtype: f16
    head_dim: 128
    tile: 128x128
    schedule: cooperative
    mask: [none, causal_top_left, causal_bottom_right]
    lse: true
    gqa: true
  - family: attention
    arch: sm80
    dtype: f16
    head_dim: 128
    tile: 32x128
    mask: [none, causal_bottom_right]
    lse: true
    gqa: true
""" + ATTENTION_SM80_VARLEN_ENTRY


def _run(cmd, cwd=None):
    t = time.time()
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-8000:]}\n{r.stderr[-8000:]}"
    print(f"[{time.time() - t:6.1f}s] {' '.join(map(str, cmd))[:160]}")
    return r


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs an sm_90 GPU visible to torch")
    given = os.environ.get("EMITTER_ATTENTION_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("attention_library_gpu")
        (work / "spec.yaml").write_text(SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", work / "spec.yaml", "-o", work / "gen"], cwd=ROOT)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", work / "gen", "--name", NAME, "-o", tree], cwd=ROOT)
        # sm80 kernels as sm_90 SASS (no PTX JIT at the first call), sm90a kernels for 90a
        _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=90;90a", "-DCMAKE_BUILD_TYPE=Release"])
        _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")])
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))), None)
    assert so is not None, f"lib{NAME}.so not built under {tree}"
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def reference(torch, q, k, v, causal, align, scale, cu_q=None, cu_k=None):
    """float64 attention in BSHD (or packed varlen); rows without a visible key: output 0, LSE -inf."""
    if cu_q is not None:
        outs, lses = [], []
        for b in range(len(cu_q) - 1):
            o, l_ = reference(torch, q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b + 1]],
                              v[None, cu_k[b]:cu_k[b + 1]], causal, align, scale)
            outs.append(o[0])
            lses.append(l_[0])
        return torch.cat(outs, 0), torch.cat(lses, 1)
    hq, hkv = q.shape[2], k.shape[2]
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    kd = kd.repeat_interleave(hq // hkv, dim=1)
    vd = vd.repeat_interleave(hq // hkv, dim=1)
    sq, sk = q.shape[1], k.shape[1]
    s = (qd @ kd.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        allowed = j <= i if align == "top_left" else j <= i + (sk - sq)
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                  # [B, H, Sq]
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = (p @ vd).transpose(1, 2)                                      # [B, Sq, H, Dv]
    return o, lse


def close(torch, got, want, what, tol=2e-2):
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite) if got.dtype == torch.float32 else True, f"{what}: -inf pattern"
    g, w = got.double()[finite], want[finite]
    err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item() if w.numel() else 0.0
    assert err < tol, f"{what}: max relative error {err:.3e}"
    return err


CASES = [   # (batch, heads_q, heads_kv, seq_q, seq_k, causal, align, scale)
    (2, 8, 2, 200, 333, False, "top_left", None),
    (2, 8, 2, 200, 333, True, "top_left", 0.1),
    (2, 8, 2, 200, 333, True, "bottom_right", None),
    (1, 4, 1, 256, 256, True, "bottom_right", 0.05),     # MQA
    (2, 8, 8, 333, 200, True, "bottom_right", None),     # seq_q > seq_k: leading rows see no key
    (2, 8, 2, 77, 130, True, "bottom_right", None),      # seq_q not a multiple of 8: sm90a runs it
    (1, 8, 2, 4097, 4097, True, "top_left", None),       # the odd prefill length: sm90a, not sm80
    (3, 8, 2, 1, 1001, True, "bottom_right", None),      # one query row against an odd key length
]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}h{c[1]}x{c[2]}s{c[3]}x{c[4]}{'_' + c[6] if c[5] else ''}"
                                              for c in CASES])
def test_attention_against_reference_and_sdpa(lib, case):
    import torch
    import torch.nn.functional as F

    b, hq, hkv, sq, sk, causal, align, scale = case
    torch.manual_seed(sq * 7 + sk)
    q = torch.randn(b, sq, hq, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(b, sk, hkv, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(b, sk, hkv, 128, device="cuda", dtype=torch.float16)
    want_o, want_l = reference(torch, q, k, v, causal, align, scale)
    sel = lib.attention_select(q, k, v, causal=causal, causal_align=align, scale=scale, lse=True)
    expect_arch = "sm90a"                        # every length: the sm90a kernels come first on cc 9.0
    assert f"attn_{expect_arch}_" in sel["kernel"], sel
    out, lse = lib.attention(q, k, v, causal=causal, causal_align=align, scale=scale, lse=True)
    torch.cuda.synchronize()
    assert out.shape == (b, sq, hq, 128) and lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    e1 = close(torch, out, want_o, f"{sel['kernel']} output")
    close(torch, lse, want_l, f"{sel['kernel']} lse", tol=1e-3)
    # torch SDPA on the same inputs (where every row sees a key, its masks are ours)
    if not causal or align == "top_left" or sk >= sq:
        kk, vv = (x.repeat_interleave(hq // hkv, dim=2).transpose(1, 2) for x in (k, v))
        if causal and align == "bottom_right" and sk != sq:
            i = torch.arange(sq, device="cuda")[:, None]
            j = torch.arange(sk, device="cuda")[None, :]
            sd = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=j <= i + (sk - sq), scale=scale)
        else:
            sd = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=causal, scale=scale)
        close(torch, out, sd.transpose(1, 2).double(), "against torch SDPA")
    # the sm80 kernel of the same operation, forced by name (also on problems sm90a takes)
    sm80 = [n for n in lib.attention_kernels() if n.startswith("attn_sm80_f16_d128")
            and (("causalbr" in n) if causal and align == "bottom_right" else ("nomask" in n) if not causal else False)]
    if sm80:
        o80, l80 = lib.attention(q, k, v, causal=causal, causal_align=align, scale=scale, lse=True, kernel=sm80[0])
        torch.cuda.synchronize()
        close(torch, o80, want_o, f"{sm80[0]} output")
        close(torch, l80, want_l, f"{sm80[0]} lse", tol=1e-3)
    print(f"{case}: {sel['kernel']} rel err {e1:.2e}")


def test_bhsd_views_and_given_out(lib):
    import torch

    b, hq, hkv, sq, sk = 2, 8, 4, 136, 300
    q = torch.randn(b, hq, sq, 128, device="cuda", dtype=torch.float16).transpose(1, 2)   # BHSD storage
    k = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    v = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    out = torch.full((b, sq, hq, 128), float("nan"), device="cuda", dtype=torch.float16)
    assert lib.attention(q, k, v, causal=True, causal_align="bottom_right", out=out) is out
    torch.cuda.synchronize()
    close(torch, out, reference(torch, q, k, v, True, "bottom_right", None)[0], "BHSD views")


def test_variable_lengths(lib):
    import torch

    lq, lk = [37, 100, 5], [50, 64, 9]
    cq = [0] + list(__import__("itertools").accumulate(lq))
    ck = [0] + list(__import__("itertools").accumulate(lk))
    q = torch.randn(cq[-1], 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(ck[-1], 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(ck[-1], 2, 64, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor(cq, device="cuda", dtype=torch.int32)
    cu_k = torch.tensor(ck, device="cuda", dtype=torch.int32)
    out, lse = lib.attention(q, k, v, causal=True, lse=True, scale=0.2, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             max_seqlen_q=max(lq), max_seqlen_k=max(lk), check_cu_seqlens=True)
    torch.cuda.synchronize()
    want_o, want_l = reference(torch, q, k, v, True, "top_left", 0.2, cq, ck)
    close(torch, out, want_o, "varlen output", tol=3e-2)
    close(torch, lse, want_l, "varlen lse", tol=1e-3)


def test_torch_compile_fullgraph(lib):
    import torch

    q = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.float16)

    def f(q, k, v):
        o, lse = lib.attention(q, k, v, causal=True, causal_align="bottom_right", lse=True)
        return o.float() * 2, lse + 1

    def g(q, k, v, out):
        lib.attention(q, k, v, out=out, scale=0.1)
        return out.float().sum(dim=-1)

    want_o, want_l = reference(torch, q, k, v, True, "bottom_right", None)
    backends = ("eager", "aot_eager") + (("inductor",) if importlib.util.find_spec("triton") else ())
    for backend in backends:
        torch._dynamo.reset()
        o, l_ = torch.compile(f, fullgraph=True, backend=backend)(q, k, v)
        torch.cuda.synchronize()
        close(torch, o / 2, want_o, f"compiled ({backend}) output")
        close(torch, l_ - 1, want_l, f"compiled ({backend}) lse", tol=1e-3)
    out = torch.empty(2, 256, 8, 128, device="cuda", dtype=torch.float16)
    got = torch.compile(g, fullgraph=True, backend=backends[-1])(q, k, v, out)
    torch.cuda.synchronize()
    close(torch, got, reference(torch, q, k, v, False, "top_left", 0.1)[0].sum(dim=-1), "attention_out compiled")


def test_cuda_graph_capture_and_replay(lib):
    import torch

    q = torch.randn(2, 200, 8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 333, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 333, 2, 128, device="cuda", dtype=torch.float16)
    out = torch.empty(2, 200, 8, 128, device="cuda", dtype=torch.float16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up outside the capture (first-launch attributes, plans)
        lib.attention(q, k, v, causal=True, out=out)
        o2, l2 = lib.attention(q, k, v, causal=True, causal_align="bottom_right", lse=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lib.attention(q, k, v, causal=True, out=out)
        o2, l2 = lib.attention(q, k, v, causal=True, causal_align="bottom_right", lse=True)   # allocated in the pool
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        v.copy_(torch.randn_like(v))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(torch, out, reference(torch, q, k, v, True, "top_left", None)[0], "graph replay (out=)")
        want_o, want_l = reference(torch, q, k, v, True, "bottom_right", None)
        close(torch, o2, want_o, "graph replay (allocated)")
        close(torch, l2, want_l, "graph replay lse", tol=1e-3)
