"""Attention backward through an exported library on the GPU: emit -> `emitter library` -> CMake build of a
library holding a forward sm80 attention kernel (lse: true), sm80 backward kernels (deterministic and key-split)
and the two GEMM kernels a library needs, then the Python loader: attention_backward() against autograd through
the float64 forward, loss.backward() through lib.attention() (the forward op's autograd), torch.compile(fullgraph=
True) of a forward + backward, a CUDA graph of the backward call, and a transformer block's training step against
torch's SDPA.

    python3 -m pytest -q -s -m gpu tests/attention/test_attention_backward_library_gpu.py      (a few minutes on 16 cores)

$EMITTER_ATTENTION_BWD_LIBRARY=<dir> reuses an exported tree built before (its build/ folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import GEMM_SPEC, load_module  # noqa: E402
from test_attention_backward_library import BACKWARD_SPEC  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
NAME = "attbwdgpu"


def _run(cmd, cwd=None):
    t = time.time()
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-8000:]}\n{r.stderr[-8000:]}"
    print(f"[{time.time() - t:6.1f}s] {' '.join(map(str, cmd))[:160]}")
    return r


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0)[0] < 8:
        pytest.skip("needs an sm_80 or newer GPU visible to torch")
    given = os.environ.get("EMITTER_ATTENTION_BWD_LIBRARY")
    if given:
        tree = Path(given)
    else:
        work = tmp_path_factory.mktemp("attention_backward_library_gpu")
        (work / "spec.yaml").write_text(GEMM_SPEC + BACKWARD_SPEC)
        py = sys.executable
        _run([py, "-m", "emitter", "emit", work / "spec.yaml", "-o", work / "gen"], cwd=ROOT)
        tree = work / NAME
        _run([py, "-m", "emitter", "library", work / "gen", "--name", NAME, "-o", tree], cwd=ROOT)
        # sm80 kernels as sm_90 SASS (no PTX JIT at the first call), sm90a GEMM for 90a
        _run(["cmake", "-S", tree, "-B", tree / "build", "-DCMAKE_CUDA_ARCHITECTURES=90;90a", "-DCMAKE_BUILD_TYPE=Release"])
        _run(["cmake", "--build", tree / "build", "-j", os.environ.get("EMITTER_TEST_JOBS", "16")])
    so = next(iter(sorted(tree.rglob(f"lib{NAME}.so"))), None)
    assert so is not None, f"lib{NAME}.so not built under {tree}"
    mod = load_module(NAME, tree / "python" / f"{NAME}.py")
    mod.load(str(so))
    return mod


def _grads64(torch, q, k, v, do, causal=True):
    """dQ, dK, dV of the float64 forward (BSHD, GQA by repeated K/V, causal from the top left) by autograd."""
    hq, hkv = q.shape[2], k.shape[2]
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    kk = kd.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vv = vd.transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    s = (qd.transpose(1, 2) @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ vv).transpose(1, 2)
    o.backward(do.double())
    return qd.grad, kd.grad, vd.grad


def _rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def _inputs(torch, b=2, s=300, hq=8, hkv=2, d=64, seed=0):
    torch.manual_seed(seed)
    mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)   # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), mk(hq)


def test_attention_backward_call_and_autograd(lib):
    torch = pytest.importorskip("torch")
    q, k, v, do = _inputs(torch)
    want = _grads64(torch, q, k, v, do)
    o, lse = lib.attention(q, k, v, causal=True, lse=True)
    for det in (False, True):
        got = lib.attention_backward(q, k, v, o, lse, do, causal=True, deterministic=det)
        errs = [_rel(g, w) for g, w in zip(got, want)]
        print("attention_backward", "deterministic" if det else "key splits", ["%.2e" % e for e in errs])
        assert all(e < 4e-2 for e in errs), errs
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    out = lib.attention(qr, kr, vr, causal=True)
    out.backward(do)
    errs = [_rel(x.grad, w) for x, w in zip((qr, kr, vr), want)]
    print("loss.backward() through lib.attention", ["%.2e" % e for e in errs])
    assert all(e < 4e-2 for e in errs), errs


def test_torch_compile_fullgraph_forward_and_backward(lib):
    torch = pytest.importorskip("torch")
    q, k, v, do = _inputs(torch, seed=1)

    def f(q, k, v):
        return (lib.attention(q, k, v, causal=True).float() * do.float()).sum()

    grads = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        fn(qr, kr, vr).backward()
        grads.append((qr.grad, kr.grad, vr.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b) or _rel(a, b.double()) < 1e-2


def test_cuda_graph_of_the_backward_call(lib):
    torch = pytest.importorskip("torch")
    q, k, v, do = _inputs(torch, seed=2)
    o, lse = lib.attention(q, k, v, causal=True, lse=True)
    eager = lib.attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lib.attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = lib.attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)        # deterministic kernels: the same bits


def test_training_step_through_the_library(lib):
    """The transformer block of tests/attention/test_attention_backward_gpu.py through lib.attention: every gradient within
    2x torch's own bf16 error (+1e-3) of the float64 block's."""
    torch = pytest.importorskip("torch")
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S, H, HKV, D = 2, 200, 8, 2, 64
    C = H * D

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.wq, self.wkv = nn.Linear(C, H * D), nn.Linear(C, 2 * HKV * D)
            self.wo = nn.Linear(H * D, C)
            self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

        def forward(self, x, attn):
            h = self.ln1(x)
            q = self.wq(h).view(B, S, H, D)
            k, v = self.wkv(h).view(B, S, 2, HKV, D).unbind(2)
            x = x + self.wo(attn(q, k, v).reshape(B, S, H * D))
            return x + self.mlp(self.ln2(x))

    def torch_attn(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                              enable_gqa=True).transpose(1, 2)

    def lib_attn(q, k, v):
        return lib.attention(q, k, v, causal=True)

    torch.manual_seed(0)
    base = Block().cuda()
    x0, w = torch.randn(B, S, C, device="cuda"), torch.randn(B, S, C, device="cuda")

    def step(dtype, attn, backend=None):
        m = Block().cuda().to(dtype)
        m.load_state_dict({k_: t.to(dtype) for k_, t in base.state_dict().items()})
        x = x0.to(dtype).requires_grad_()
        if backend is not None:
            with sdpa_kernel(backend):
                (m(x, attn).double() * w.double()).sum().backward()
        else:
            (m(x, attn).double() * w.double()).sum().backward()
        g = {n: p.grad.double() for n, p in m.named_parameters()}
        g["x"] = x.grad.double()
        return g

    truth = step(torch.float64, torch_attn, SDPBackend.MATH)
    g_torch, g_lib = step(torch.bfloat16, torch_attn), step(torch.bfloat16, lib_attn)
    rows = [(n, _rel(g_lib[n], truth[n]), _rel(g_torch[n], truth[n])) for n in truth]
    for n, a, b in rows:
        print(f"{n:16} library {a:9.2e}  torch {b:9.2e}")
    bad = [r for r in rows if not r[1] <= 2 * r[2] + 1e-3]
    assert not bad, bad
